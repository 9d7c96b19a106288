"""Built-in attacks, one per file. Importing this package registers them all."""
from . import pgd  # noqa: F401
from .base import ATTACKS, Attack, AttackResult, create_attack, list_attacks, register_attack  # noqa: F401
