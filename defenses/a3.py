r"""A3: activation amplification and attenuation, a feature-space module added to adversarial training.

It sits on the output ``h`` (N, C, H, W) of a late block of the classifier (here the last block of
:class:`defenses.small_cnn.SmallCNN`, just before global pooling and the linear head ``g``).

Mask. Mask logits come from the pooled features and are softly bounded (a logit cannot grow without limit):

    ℓ = B·tanh((W·GAP(h) + b) / B) ∈ (−B, B)^C,   B = ``logit_bound`` (10), GAP = global average pool
    m = σ((ℓ + ν) / τ) ∈ (0, 1)^C,   ν = log u − log(1 − u),  u ~ U(0, 1)   (training)
    m = σ(ℓ / τ)                                                              (inference)

(in code m is squeezed into [10⁻⁶, 1 − 10⁻⁶] so it never rounds to 0 or 1). ν, the difference of two
Gumbel(0, 1) draws, makes ``m`` the binary Gumbel-softmax (concrete)
relaxation of a Bernoulli(σ(ℓ)) channel mask (Jang et al. 2017; Maddison et al. 2017) with
temperature τ (``tau``): during training the mask is a differentiable sample, at inference its
deterministic mean-like value. ``stochastic=True`` keeps ν at inference (then the defense is random
and the harness evaluates it with EOT).

Bounded log-ratio scaling. Each channel has a learnable strength a_c = β·σ(ρ_c) ∈ (0, β), β =
``max_log_ratio``. The two views scale the masked channels' magnitude by

    attenuation   h⁻ = h · exp(−a ⊙ m)        log(|h⁻| / |h|) = −a_c·m_c ∈ (−β, 0)
    amplification h⁺ = h · exp(+a ⊙ m)        log(|h⁺| / |h|) = +a_c·m_c ∈ (0, β)

(per channel, broadcast over H×W; signs are kept). The log-ratio is bounded by β, so neither view
can switch a channel off or blow it up: the network cannot satisfy the losses below by degenerate
scaling. At inference the classifier is ``g(h⁻)``: the channels the mask selects are attenuated.
Amplification is used only in training, as the negative view.

Losses (per batch; x clean, x' its training adversarial example, y the label, z = g(·) logits):

    L_CE   = CE(z⁻(x'), y)                                  the adversarial-training loss, on the inference view
    L_rank = mean relu(δ + CE(z⁻(x'), y) − CE(z⁺(x'), y))   δ = ``rank_margin``
    L_con  = mean softplus((cos(z⁻(x'), z⁺(x')) − cos(z⁻(x'), z⁻(x))) / T)   T = ``con_temperature``
    L      = L_CE + λ_rank·L_rank + λ_con·L_con

Why: the ranking loss asks that amplifying the selected channels on an adversarial input hurts
more than attenuating them, by a margin — so the mask must select the channels the adversarial
perturbation exploits (the non-robust ones), which attenuation then suppresses. The contrastive
loss is two-way InfoNCE on ℓ2-normalised logits: the adversarial input's attenuated logits should
point where the clean input's attenuated logits point (positive pair) and away from its amplified
logits (negative pair), so attenuation removes what the perturbation added rather than merely
changing the logits' scale. Same seed, data order and attack as plain adversarial training; only
these terms and the module differ, so ``at`` and ``a3`` are paired by construction. (One side effect
of L_con: the clean batch also goes through the network in training mode, so BatchNorm's running
statistics see clean images as well as adversarial ones, which plain ``at`` does not.)

Every hyper-parameter is stored in the module's state dict (buffers ``tau``, ``max_log_ratio``,
``logit_bound``), so a weights file alone rebuilds the module.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# the mask is squeezed into [ε, 1 − ε] so it stays strictly inside (0, 1) in float32 even when the
# logits plus noise saturate the sigmoid (σ(z) rounds to 1.0 for z > 17); gradients are unchanged up to 1 − 2ε
_MASK_EPS = 1e-6


@dataclass(frozen=True)
class A3Config:
    """The module's architecture options (stored as buffers) and the recipe's loss weights."""

    tau: float = 0.5
    max_log_ratio: float = 1.0
    logit_bound: float = 10.0
    rank_weight: float = 1.0
    rank_margin: float = 0.5
    con_weight: float = 1.0
    con_temperature: float = 0.5

    def __post_init__(self) -> None:
        for name in ("tau", "max_log_ratio", "logit_bound", "con_temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"A3 option {name} must be > 0, got {getattr(self, name)}")
        for name in ("rank_weight", "rank_margin", "con_weight"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"A3 option {name} must be >= 0, got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)


def logistic_noise(shape: torch.Size | tuple[int, ...], *, generator: torch.Generator | None = None,
                   device: torch.device | str = "cpu") -> Tensor:
    """ν = log u − log(1 − u), u ~ U(0, 1): a difference of two Gumbel(0, 1) draws (drawn on the CPU
    from ``generator`` when given, so a seeded draw is the same on every device)."""
    u = torch.rand(shape, generator=generator).clamp_(1e-6, 1 - 1e-6) if generator is not None \
        else torch.rand(shape, device=device).clamp_(1e-6, 1 - 1e-6)
    return (u.log() - (-u).log1p()).to(device)


class A3(nn.Module):
    """The A3 module on ``channels`` feature channels; ``forward`` is the inference (attenuation) view."""

    def __init__(self, channels: int, *, tau: float = 0.5, max_log_ratio: float = 1.0, logit_bound: float = 10.0,
                 stochastic: bool = False) -> None:
        super().__init__()
        self.gate = nn.Linear(channels, channels)
        self.strength = nn.Parameter(torch.zeros(channels))  # ρ: a_c = β·σ(ρ_c), β/2 at initialisation
        with torch.no_grad():  # zero initialisation: m = σ(0) = 1/2 everywhere, and no draw from any RNG
            self.gate.weight.zero_()
            self.gate.bias.zero_()
        self.register_buffer("tau", torch.tensor(float(tau)))
        self.register_buffer("max_log_ratio", torch.tensor(float(max_log_ratio)))
        self.register_buffer("logit_bound", torch.tensor(float(logit_bound)))
        self.stochastic = bool(stochastic)

    def mask_logits(self, h: Tensor) -> Tensor:
        """ℓ = B·tanh((W·GAP(h) + b)/B), shape (N, C): what an adaptive attack on the mask targets."""
        return self.logit_bound * torch.tanh(self.gate(h.mean(dim=(2, 3))) / self.logit_bound)

    def mask(self, h: Tensor, noise: Tensor | None = None) -> Tensor:
        """m = σ((ℓ + ν)/τ) ∈ (0, 1); ``noise`` ν is drawn here when training or ``stochastic`` and not given."""
        logits = self.mask_logits(h)
        if noise is None and (self.training or self.stochastic):
            noise = logistic_noise(logits.shape, device=logits.device)
        if noise is not None:
            logits = logits + noise
        return _MASK_EPS + (1 - 2 * _MASK_EPS) * torch.sigmoid(logits / self.tau)

    def log_ratio(self, m: Tensor) -> Tensor:
        """a ⊙ m, shape (N, C): the magnitude log-ratio of either view, in (0, β)."""
        return self.max_log_ratio * torch.sigmoid(self.strength) * m

    def views(self, h: Tensor, noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(attenuated h⁻, amplified h⁺, mask m) from one mask draw."""
        m = self.mask(h, noise)
        r = self.log_ratio(m)[:, :, None, None]
        return h * torch.exp(-r), h * torch.exp(r), m

    def forward(self, h: Tensor, noise: Tensor | None = None) -> Tensor:
        return h * torch.exp(-self.log_ratio(self.mask(h, noise))[:, :, None, None])

    def view(self, h: Tensor, view: "A3View", noise: Tensor | None, head: Callable[[Tensor], Tensor]) -> Tensor:
        """``head`` applied to one view of ``h`` (logits), or the per-sample mean log-ratio for ``ATTENUATION``."""
        if view is A3View.PLAIN:
            return head(h)
        if view is A3View.ATTENUATION:
            return self.log_ratio(self.mask(h, noise)).mean(dim=1)
        att, amp, _ = self.views(h, noise)
        return head(amp if view is A3View.AMPLIFIED else att)


class A3View(Enum):
    """Outputs of a network with A3. The defense is ``ATTENUATED``; the others exist for adaptive attacks:
    ``PLAIN`` (the module removed) and ``AMPLIFIED`` logits as transfer surrogates (both branches of the
    module), ``ATTENUATION`` (mean a⊙m per sample) as the auxiliary loss of a mask-aware attack."""

    ATTENUATED = "attenuated"
    PLAIN = "plain"
    AMPLIFIED = "amplified"
    ATTENUATION = "attenuation"


def a3_losses(z_att_adv: Tensor, z_amp_adv: Tensor, z_att_clean: Tensor, y: Tensor, cfg: A3Config) -> dict[str, Tensor]:
    """The loss terms of the module docstring: ``ce``, ``rank``, ``con`` and their weighted sum ``loss``."""
    ce_att = F.cross_entropy(z_att_adv, y, reduction="none")
    ce_amp = F.cross_entropy(z_amp_adv, y, reduction="none")
    rank = F.relu(cfg.rank_margin + ce_att - ce_amp).mean()
    pos = F.cosine_similarity(z_att_adv, z_att_clean, dim=1)
    neg = F.cosine_similarity(z_att_adv, z_amp_adv, dim=1)
    con = F.softplus((neg - pos) / cfg.con_temperature).mean()
    ce = ce_att.mean()
    return {"loss": ce + cfg.rank_weight * rank + cfg.con_weight * con, "ce": ce, "rank": rank, "con": con}
