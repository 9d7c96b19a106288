"""Built-in training recipes (``harness train NAME``). Importing this module registers them all;
a new recipe is one file calling :func:`harness.training.recipe.register_recipe` plus its import here."""
from . import adv_train, ddpm_train, smoothing_train, vit_train  # noqa: F401  (at, a3, ddpm, smoothing, vit)
from .amrm_pure import finetune, train  # noqa: F401  (ramrm, mae)
