"""Built-in defenses. Importing this package registers them all."""
from . import (amrm_pure, at_small, bit_depth, diffpure, gaussian_noise, jpeg, neuroshield, smoothing,  # noqa: F401
               undefended, vit_small)
