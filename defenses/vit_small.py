"""A small vision transformer for CIFAR-10 (timm's ``VisionTransformer``) and the defense ``vit-small``.

The network is ``timm.models.vision_transformer.VisionTransformer`` with 32x32 inputs cut into 4x4 patches
(64 patch tokens and a class token), pre-norm blocks, GELU MLPs and a linear head on the class token; the
CIFAR-10 normalisation is inside the model, so it takes images in [0, 1]. Default size (:class:`ViTConfig`):
embedding 128, 6 blocks of 4 heads, MLP hidden width 512 (ratio 4): 1.2 M parameters. No dropout or stochastic
depth, so a forward pass draws no random numbers (the defense is deterministic and training resumes exactly).

Its architecture is stored in the weights (the persistent buffer ``arch``), so a weights file alone rebuilds the
model. ``vit-small`` loads ``defenses/weights/vit_small.pt`` (made by ``harness train vit``,
``defenses/vit_train.py``) or ``weights=PATH``, with ``torch.load(weights_only=True)``. There is no purifier, so
every gradient is exact. timm is imported only when a model is built.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from harness.api.defense import Defense, register_defense
from harness.errors import MissingInputError, UsageError
from harness.sources.models import load_state_dict

from .small_cnn import CIFAR10_MEAN, CIFAR10_STD, WEIGHTS_DIR

DEFAULT_WEIGHTS = WEIGHTS_DIR / "vit_small.pt"


@dataclass(frozen=True)
class ViTConfig:
    """The architecture; every field is an integer, stored in the weights as the buffer ``arch``."""

    img_size: int = 32
    patch_size: int = 4
    embed_dim: int = 128
    depth: int = 6
    num_heads: int = 4
    mlp_hidden: int = 512
    num_classes: int = 10

    def __post_init__(self) -> None:
        bad = [k for k, v in asdict(self).items() if not (isinstance(v, int) and v >= 1)]
        if bad:
            raise UsageError(f"ViT option(s) {', '.join(bad)} must be positive integers, got {asdict(self)}")
        if self.img_size % self.patch_size or self.embed_dim % self.num_heads:
            raise UsageError(f"need patch size dividing image size and heads dividing embed dim; got patch "
                             f"{self.patch_size}, image {self.img_size}, heads {self.num_heads}, embed {self.embed_dim}")

    def to_dict(self) -> dict:
        return asdict(self)


ARCH_FIELDS = tuple(ViTConfig.__dataclass_fields__)


class CifarViT(nn.Module):
    """timm's ``VisionTransformer`` behind the CIFAR-10 normalisation; ``blocks`` are its transformer blocks
    (block i's MLP hidden activation is ``blocks[i].mlp.act``, where NeuroShield-ViT scales neurons)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        from timm.models.vision_transformer import VisionTransformer

        self.config = config
        self.register_buffer("mean", torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(CIFAR10_STD).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("arch", torch.tensor([getattr(config, k) for k in ARCH_FIELDS], dtype=torch.int64))
        self.vit = VisionTransformer(img_size=config.img_size, patch_size=config.patch_size,
                                     num_classes=config.num_classes, embed_dim=config.embed_dim, depth=config.depth,
                                     num_heads=config.num_heads, mlp_ratio=config.mlp_hidden / config.embed_dim,
                                     qkv_bias=True, drop_rate=0.0, attn_drop_rate=0.0, drop_path_rate=0.0)
        if self.vit.blocks[0].mlp.fc1.out_features != config.mlp_hidden:
            raise UsageError(f"mlp_hidden {config.mlp_hidden} is not representable as a timm mlp_ratio of embed_dim "
                             f"{config.embed_dim}; pick a multiple of it")

    @property
    def blocks(self) -> nn.Sequential:
        return self.vit.blocks

    def forward(self, x: Tensor) -> Tensor:
        return self.vit((x - self.mean) / self.std)


def build_vit(config: ViTConfig, *, seed: int) -> CifarViT:
    """A freshly initialised network, its weights a function of ``seed`` alone (the global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return CifarViT(config)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def load_vit(path: str | Path) -> CifarViT:
    """A :class:`CifarViT` from a state-dict file (float16 or float32), its architecture read from ``arch``."""
    state = load_state_dict(path, weights_only=True)
    if "arch" not in state or "vit.cls_token" not in state:
        raise UsageError(f"{str(path)!r} is not a small-ViT state dict (no arch / vit.cls_token); make one with "
                         "`harness train vit`")
    values = [int(v) for v in state["arch"].tolist()]
    if len(values) != len(ARCH_FIELDS):
        raise UsageError(f"{str(path)!r} stores {len(values)} architecture fields, expected {len(ARCH_FIELDS)} "
                         f"({', '.join(ARCH_FIELDS)}); retrain it with `harness train vit`")
    model = CifarViT(ViTConfig(**dict(zip(ARCH_FIELDS, values))))
    try:
        model.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in state.items()})
    except RuntimeError as exc:
        raise UsageError(f"{str(path)!r} does not match its stored ViT architecture: {str(exc).splitlines()[0]}") from exc
    return model.eval()


def vit_weights(weights: str | None) -> Path:
    """The weights file to load: ``weights`` if given, else the default; a missing file names how to make it."""
    path = DEFAULT_WEIGHTS if weights is None else Path(weights).expanduser()
    if not path.is_file():
        raise MissingInputError(f"no ViT weights at {str(path)!r}: make them with `harness train vit"
                                f"{'' if weights is None else ' --out ' + str(path)}` (docs/neuroshield.md) or pass "
                                "--defense-opt weights=PATH")
    return path


@register_defense("vit-small")
def vit_small(weights: str | None = None) -> Defense:
    """The plain small ViT trained by ``harness train vit`` (no defense); ``weights``: a state-dict path."""
    model = load_vit(vit_weights(weights))
    return Defense(model, None, num_classes=model.config.num_classes, name="vit-small", trained_on="cifar10")
