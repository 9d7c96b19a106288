"""Any ``torchattacks`` attack by class name with keyword options.

Spec forms: ``torchattack`` with option ``cls="CW"`` (plus the class's own options), or the
registered alias ``torchattacks:<ClassName>`` for every class in ``torchattacks.__all__``.
The model handed over is the target's module, so gradient modes, EOT (logits averaged over
draws) and budget counting apply. ``eps``/``norm`` describe the threat model the result is
clipped to and recorded under; ``eps`` is also passed to the class when it takes one.
"""
from __future__ import annotations

import inspect
import math
from typing import Any

from torch import Tensor

from harness.target import Target

from ._thirdparty import CountedModule, default_draws, finalize, quiet_stdout, view
from harness.attack import ATTACKS, Attack, AttackResult, Norm, register_attack

# torchattacks 3.5.1's ``__all__`` minus the wrappers (MultiAttack, LGV take attacks, not a model).
# Listed statically so registering the aliases does not import torchattacks (~1.5 s); checked at use.
CLASSES = ("VANILA", "GN", "FGSM", "BIM", "RFGSM", "PGD", "EOTPGD", "FFGSM", "TPGD", "MIFGSM", "UPGD", "APGD", "APGDT",
           "DIFGSM", "TIFGSM", "Jitter", "NIFGSM", "PGDRS", "SINIFGSM", "VMIFGSM", "VNIFGSM", "SPSA", "JSMA", "EADL1",
           "EADEN", "PIFGSM", "PIFGSMPP", "CW", "PGDL2", "DeepFool", "PGDRSL2", "SparseFool", "OnePixel", "Pixle",
           "FAB", "AutoAttack", "Square")


def _classes() -> list[str]:
    import torchattacks
    return [n for n in CLASSES if hasattr(torchattacks, n)]


class TorchAttack(Attack):
    """A torchattacks attack class instantiated at call time on the target's module.

    Args:
        cls: class name in ``torchattacks`` (e.g. ``"CW"``, ``"DeepFool"``, ``"PGDL2"``).
        eps, norm: threat model for clipping and records (``eps=inf`` for unbounded minimum-norm attacks).
        grad_mode, eot: override the target's gradient mode / EOT draws.
        draws: draws for the final evaluation on stochastic defenses.
        **options: keyword options of the class (validated against its signature).
    """

    name = "torchattack"

    def __init__(self, *, cls: str, eps: float = 8 / 255, norm: Norm = "Linf", grad_mode: str | None = None,
                 eot: int | None = None, draws: int | None = None, **options: Any) -> None:
        super().__init__(eps=eps, norm=norm)
        import torchattacks
        names = _classes()
        if cls not in names:
            raise ValueError(f"torchattack: unknown torchattacks class {cls!r}; accepted: {', '.join(names)}")
        klass = getattr(torchattacks, cls)
        params = inspect.signature(klass.__init__).parameters
        unknown = sorted(set(options) - set(params))
        if unknown:
            accepted = [p for p in params if p not in ("self", "model")]
            raise ValueError(f"torchattack {cls}: unknown option(s) {unknown}; accepted: {', '.join(accepted)}")
        if "eps" in params and math.isfinite(self.eps):
            options.setdefault("eps", self.eps)
        self.cls, self.grad_mode, self.eot, self.draws = cls, grad_mode, eot, draws
        self._options = options
        for k, v in options.items():  # recorded in config() (plain values only)
            if not hasattr(self, k):
                setattr(self, k, v)

    def config(self) -> dict[str, Any]:
        cfg = super().config()
        cfg.update({k: v for k, v in self._options.items() if isinstance(v, (int, float, str, bool))})
        return cfg

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        import torch
        import torchattacks

        t = view(target, self.grad_mode, self.eot)
        model = CountedModule(t).eval()
        with quiet_stdout():
            atk = getattr(torchattacks, self.cls)(model, **self._options)
            atk.set_device(x.device)
            torch.manual_seed(seed)  # torchattacks draws its random starts from the global RNG
            x_adv = atk(x, y)
        return finalize(target, x, x_adv, y, eps=self.eps, norm=self.norm, draws=default_draws(target, self.draws))


@register_attack("torchattack")
def torchattack(**options: Any) -> TorchAttack:
    """A torchattacks attack; ``cls`` names the class."""
    return TorchAttack(**options)


def _alias(cls: str):
    def factory(**options: Any) -> TorchAttack:
        return TorchAttack(cls=cls, **options)
    factory.__doc__ = f"torchattacks.{cls} through the harness target."
    factory.__qualname__ = f"torchattacks_{cls}"
    return factory


for _cls in CLASSES:
    ATTACKS.add(f"torchattacks:{_cls}", _alias(_cls))
