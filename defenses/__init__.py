"""Built-in defenses. Importing this package registers them all."""
from . import (amrm_pure, at_small, bit_depth, diffpure, diffusion_smoothing, gaussian_noise, jpeg, neuroshield,  # noqa: F401
               smoothing, undefended, vit_small)
