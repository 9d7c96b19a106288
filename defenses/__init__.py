"""Built-in defenses. Importing this package registers them all."""
from . import (  # noqa: F401
               amrm_pure,
               at_small,
               bit_depth,
               diffpure,
               diffusion_smoothing,
               gaussian_noise,
               jpeg,
               neuroshield,
               smoothing,
               undefended,
               vit_small,
)
