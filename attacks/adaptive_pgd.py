"""Named PGD configurations of the adaptive-attack literature.

- ``bpda-eot``: PGD-100 (cosine step schedule) with BPDA gradients (purifier identity in the backward
  pass; Athalye et al., 2018), a fixed gradient mode declared in its capabilities, and EOT on
  stochastic defenses: the standard answer to non-differentiable purifiers.
- ``pgd200-eot20``: PGD-200 with EOT, the "adaptive" configuration of the diffusion-purification
  literature (e.g. Lee & Kim, 2023); exact (``full``) gradients unless the run or battery says otherwise.

EOT is the resolver's (``harness.battery.resolve``): 20 draws on stochastic defenses by default and 1 on
deterministic ones (every draw would be identical); ``--eot``, a battery entry's ``eot`` or
``--attack-opt NAME.eot=…`` change it, and the record states what ran.
"""
from __future__ import annotations

from harness.api.attack import ANY_THREAT, Capabilities, register_attack
from harness.api.factory_options import Variant

from .pgd import PGD


class BPDAEOT(PGD):
    """PGD that always runs BPDA gradients (its capabilities say so; the resolver enforces it)."""

    name = "bpda-eot"
    capabilities = Capabilities(fixed_grad_mode="bpda", supports_autocast=True, effort_option="steps",
                                threats=(ANY_THREAT,), priority=0)


register_attack("bpda-eot")(Variant(
    BPDAEOT, "PGD-100 with BPDA gradients, cosine step schedule, EOT-20 on stochastic defenses; options as ``pgd``.",
    defaults={"steps": 100, "schedule": "cosine"}))
register_attack("pgd200-eot20")(Variant(PGD, "PGD-200 with EOT-20 on stochastic defenses; options as ``pgd``.",
                                        defaults={"steps": 200}))
