"""Built-in attacks, one per file. Importing this package registers them all."""
from . import pgd  # noqa: F401
from . import adaptive_pgd, apgd, apgd_targeted, autoattack, cw, deepfool, fab, rays, square  # noqa: F401
from . import torchattacks_adapter, transfer  # noqa: F401
from . import joint_rec  # noqa: F401
from harness.api.attack import ATTACKS, Attack, AttackResult, create_attack, list_attacks, register_attack  # noqa: F401
