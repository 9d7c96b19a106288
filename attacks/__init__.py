"""Built-in attacks, one per file. Importing this package registers them all."""
from harness.api.attack import ATTACKS, Attack, AttackResult, create_attack, list_attacks, register_attack  # noqa: F401

from . import (  # noqa: F401  # noqa: F401
    adaptive_pgd,
    apgd,
    apgd_targeted,
    autoattack,
    cw,
    deepfool,
    fab,
    joint_rec,  # noqa: F401
    pgd,  # noqa: F401
    rays,
    square,
    torchattacks_adapter,
    transfer,
)
