"""Any ``torchattacks`` attack by class name with keyword options.

Spec forms: ``torchattack`` with option ``cls="CW"`` (plus the class's own options), or the
registered alias ``torchattacks:<ClassName>`` for every class in ``torchattacks.__all__``.
The model handed over is the target's module, so the resolved gradient mode, EOT (logits averaged
over ``target.eot`` draws) and budget counting apply. ``eps``/``norm`` describe the threat model the
result is clipped to and recorded under; ``eps`` is also passed to the class when it takes one.
bfloat16 autocast is declared only for the classes tested under it (:data:`AUTOCAST_CLASSES`).
"""
from __future__ import annotations

import inspect
import math
from typing import Any

from torch import Tensor

from harness.api.attack import ATTACKS, Attack, AttackBudget, AttackResult, Capabilities, Norm, register_attack
from harness.api.factory_options import Variant, options_of
from harness.api.target import Target

from ._thirdparty import default_draws, finalize, quiet_stdout

# torchattacks 3.5.1's ``__all__`` minus the wrappers (MultiAttack, LGV take attacks, not a model).
# Listed statically so registering the aliases does not import torchattacks (~1.5 s); checked at use.
CLASSES = ("VANILA", "GN", "FGSM", "BIM", "RFGSM", "PGD", "EOTPGD", "FFGSM", "TPGD", "MIFGSM", "UPGD", "APGD", "APGDT",
           "DIFGSM", "TIFGSM", "Jitter", "NIFGSM", "PGDRS", "SINIFGSM", "VMIFGSM", "VNIFGSM", "SPSA", "JSMA", "EADL1",
           "EADEN", "PIFGSM", "PIFGSMPP", "CW", "PGDL2", "DeepFool", "PGDRSL2", "SparseFool", "OnePixel", "Pixle",
           "FAB", "AutoAttack", "Square")
# the classes run under bfloat16 autocast in tests/attacks/test_autocast.py; the others are refused with --autocast bf16
AUTOCAST_CLASSES = frozenset({"CW", "DeepFool", "PGD", "PGDL2", "FGSM"})


def _classes() -> list[str]:
    import torchattacks
    return [n for n in CLASSES if hasattr(torchattacks, n)]


class TorchAttack(Attack):
    """A torchattacks attack class instantiated at call time on the target's module.

    Args:
        cls: class name in ``torchattacks`` (e.g. ``"CW"``, ``"DeepFool"``, ``"PGDL2"``).
        eps, norm: threat model for clipping and records (in Python, ``eps=inf`` for unbounded minimum-norm attacks; runs take finite budgets only).
        draws: draws for the final evaluation on stochastic defenses.
        **options: keyword options of the class (validated against its signature).
    """

    name = "torchattack"

    def __init__(self, *, cls: str, eps: float = 8 / 255, norm: Norm = "Linf", draws: int | None = None,
                 **options: Any) -> None:
        super().__init__(eps=eps, norm=norm)
        import torchattacks
        names = _classes()
        if cls not in names:
            raise ValueError(f"torchattack: unknown torchattacks class {cls!r}; accepted: {', '.join(names)}")
        klass = getattr(torchattacks, cls)
        params = inspect.signature(klass.__init__).parameters
        accepted = options_of(TorchAttacksClass(cls))  # the class's options and the harness's
        unknown = accepted.unknown(options) if accepted else []
        if accepted and unknown:
            raise ValueError(f"torchattacks:{cls} {accepted.refusal(unknown)}")
        if "eps" in params and math.isfinite(self.eps):
            options.setdefault("eps", self.eps)
        self.cls, self.draws = cls, draws
        self._options = options
        # the class's defaults, overridden by the given options: what the budget declares
        self._settings = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
        self._settings.update(options)
        self.capabilities = Capabilities(supports_autocast=cls in AUTOCAST_CLASSES,
                                         effort_option="steps" if "steps" in params else None)

    def config(self) -> dict[str, Any]:
        cfg = super().config()
        cfg.update({k: v for k, v in self._options.items() if isinstance(v, (int, float, str, bool))})
        return cfg

    def budget(self) -> AttackBudget:
        # torchattacks' option names: steps, n_restarts, alpha (step) or lr (C&W's Adam), n_queries
        def get(key: str, default: float) -> float:
            v = self._settings.get(key)
            return v if isinstance(v, (int, float)) and not isinstance(v, bool) else default

        return AttackBudget(iterations=int(get("steps", 1)), restarts=int(get("n_restarts", 1)),
                            step_size=float(get("alpha", get("lr", 0.0))), loss=f"torchattacks.{self.cls}",
                            queries=int(get("n_queries", 0)))

    def run(self, target: Target, x: Tensor, y: Tensor, *, seed: int) -> AttackResult:
        import torch
        import torchattacks

        model = target.as_module().eval()
        with quiet_stdout():
            atk = getattr(torchattacks, self.cls)(model, **self._options)
            atk.set_device(x.device)
            torch.manual_seed(seed)  # torchattacks draws its random starts from the global RNG
            x_adv = atk(x, y)
        return finalize(target, x, x_adv, y, eps=self.eps, norm=self.norm, draws=default_draws(target, self.draws))


register_attack("torchattack")(Variant(
    TorchAttack, "A torchattacks attack; ``cls`` names the class, the other options are that class's (``harness list "
    "attacks torchattacks:CLS`` shows them)."))


class TorchAttacksClass:
    """``torchattacks:<cls>``: :class:`TorchAttack` of one class. Its options (its signature) are the harness's
    (``eps``, ``norm``, ``draws``) and the class's own, read from the class when asked for."""

    def __init__(self, cls: str) -> None:
        self.cls = cls
        self.__doc__ = f"torchattacks.{cls} through the harness target."
        self.__qualname__ = f"torchattacks_{cls}"

    @property
    def __signature__(self) -> inspect.Signature:
        own = [p for p in inspect.signature(TorchAttack).parameters.values() if p.name != "cls"]
        try:
            import torchattacks
        except ImportError:  # not installed: the options are not known, any is passed on (and refused at use)
            return inspect.Signature(own)
        names = {p.name for p in own}
        theirs = [p.replace(kind=p.KEYWORD_ONLY) for p in inspect.signature(getattr(torchattacks, self.cls).__init__)
                  .parameters.values() if p.name not in names | {"self", "model"} and p.kind in
                  (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        return inspect.Signature([p for p in own if p.kind is not p.VAR_KEYWORD] + theirs)

    def __call__(self, **options: Any) -> TorchAttack:
        return TorchAttack(cls=self.cls, **options)


for _cls in CLASSES:
    ATTACKS.add(f"torchattacks:{_cls}", TorchAttacksClass(_cls))
