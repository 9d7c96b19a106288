"""The arithmetic precision of the attacks (``--autocast``), declared once: the config rule, the command line, the
resolver's refusal of attacks that cannot run under it, the stage's ``torch.autocast`` and the comparison of two runs
read it from here. No torch: the config imports it."""
from __future__ import annotations

from enum import Enum

from harness.errors import UsageError


class Autocast(str, Enum):
    """``none``: float32 throughout; ``bf16``: the attacks' forward and backward passes under bfloat16 autocast."""

    NONE = "none"
    BF16 = "bf16"

    @property
    def dtype(self) -> str | None:
        """The name of the ``torch`` dtype autocast runs in (None: no autocast)."""
        return {Autocast.NONE: None, Autocast.BF16: "bfloat16"}[self]

    @classmethod
    def parse(cls, mode: str | None) -> Autocast:
        """The mode named ``mode`` (None: ``none``); a one-line error naming the accepted ones otherwise."""
        try:
            return cls(mode or cls.NONE.value)
        except ValueError:
            raise UsageError(f"unknown autocast mode {mode!r}; accepted: {', '.join(AUTOCAST_MODES)}") from None


AUTOCAST_MODES: tuple[str, ...] = tuple(m.value for m in Autocast)
