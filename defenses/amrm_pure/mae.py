"""A small masked autoencoder (He et al., 2022, "Masked Autoencoders Are Scalable Vision Learners")
for 32×32 images, built from timm's ViT ``Block`` and ``PatchEmbed`` (no hand-written attention).

AMRM-Pure purifies an input by descending this model's reconstruction loss, so the loss must be
differentiable twice (the purifier differentiates it w.r.t. the input, and an exact-gradient attack
differentiates through that). PyTorch's fused CPU attention kernel has no double backward, hence
``fused_attn=False`` by default (math attention, same weights); training may switch it on.

Masks are deterministic when a ``noise`` tensor or a ``generator`` is given: the kept patches are
those with the smallest noise, as in the reference MAE implementation.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from timm.layers import PatchEmbed
from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed
from timm.models.vision_transformer import Block
from torch import Tensor, nn


@dataclass(frozen=True)
class MAEConfig:
    """Architecture of :class:`MaskedAutoencoder`; stored next to trained weights."""
    img_size: int = 32
    patch_size: int = 4
    in_chans: int = 3
    embed_dim: int = 192
    depth: int = 6
    num_heads: int = 3
    decoder_embed_dim: int = 128
    decoder_depth: int = 2
    decoder_num_heads: int = 4
    mlp_ratio: float = 4.0

    def to_dict(self) -> dict:
        return asdict(self)


# named sizes: "small" (1.0 M parameters) and "base" (3.1 M) are the committed CIFAR-10 models, "tiny" is for tests
MAE_PRESETS: dict[str, MAEConfig] = {
    "tiny": MAEConfig(embed_dim=32, depth=1, num_heads=2, decoder_embed_dim=32, decoder_depth=1, decoder_num_heads=2,
                      mlp_ratio=2.0),
    "small": MAEConfig(embed_dim=128, depth=4, num_heads=4, decoder_embed_dim=96, decoder_depth=2, decoder_num_heads=4),
    "base": MAEConfig(),
}


def mae_config(preset: str = "small", **overrides: float) -> MAEConfig:
    """A named :data:`MAE_PRESETS` entry with some fields overridden."""
    if preset not in MAE_PRESETS:
        raise ValueError(f"unknown MAE preset {preset!r}; accepted: {', '.join(MAE_PRESETS)}")
    base = MAE_PRESETS[preset].to_dict()
    unknown = set(overrides) - set(base)
    if unknown:
        raise ValueError(f"unknown MAE option(s) {sorted(unknown)}; accepted: {', '.join(base)}")
    base.update({k: v for k, v in overrides.items() if v is not None})
    return MAEConfig(**base)


class MaskedAutoencoder(nn.Module):
    """ViT encoder on the visible patches + light ViT decoder predicting the pixels of all patches."""

    def __init__(self, config: MAEConfig | None = None, *, fused_attn: bool = False) -> None:
        super().__init__()
        c = self.config = config or MAEConfig()
        if c.img_size % c.patch_size:
            raise ValueError(f"img_size {c.img_size} must be a multiple of patch_size {c.patch_size}")
        self.patch_embed = PatchEmbed(c.img_size, c.patch_size, c.in_chans, c.embed_dim)
        grid = c.img_size // c.patch_size
        self.num_patches = grid * grid
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.embed_dim))
        # fixed 2-D sin-cos position embeddings (as in MAE); buffers, not parameters
        self.register_buffer("pos_embed", build_sincos2d_pos_embed([grid, grid], c.embed_dim)[None], persistent=False)
        self.blocks = nn.ModuleList(Block(c.embed_dim, c.num_heads, c.mlp_ratio, qkv_bias=True) for _ in range(c.depth))
        self.norm = nn.LayerNorm(c.embed_dim)
        self.decoder_embed = nn.Linear(c.embed_dim, c.decoder_embed_dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, c.decoder_embed_dim))
        self.register_buffer("decoder_pos_embed", build_sincos2d_pos_embed([grid, grid], c.decoder_embed_dim)[None],
                             persistent=False)
        self.decoder_blocks = nn.ModuleList(Block(c.decoder_embed_dim, c.decoder_num_heads, c.mlp_ratio, qkv_bias=True)
                                            for _ in range(c.decoder_depth))
        self.decoder_norm = nn.LayerNorm(c.decoder_embed_dim)
        self.decoder_pred = nn.Linear(c.decoder_embed_dim, c.patch_size ** 2 * c.in_chans)
        self._init_weights()
        self.set_fused_attn(fused_attn)

    def _init_weights(self) -> None:
        nn.init.normal_(self.cls_token, std=0.02)
        nn.init.normal_(self.mask_token, std=0.02)
        w = self.patch_embed.proj.weight.data
        nn.init.xavier_uniform_(w.view(w.shape[0], -1))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def set_fused_attn(self, enabled: bool) -> None:
        """Fused attention is faster but has no double backward; exact purifier gradients need it off."""
        for block in [*self.blocks, *self.decoder_blocks]:
            block.attn.fused_attn = bool(enabled)

    # ---- patches -------------------------------------------------------------------------------
    def patchify(self, imgs: Tensor) -> Tensor:
        """(N, C, H, W) -> (N, L, p*p*C)."""
        p, n, ch = self.config.patch_size, imgs.shape[0], self.config.in_chans
        h = imgs.shape[2] // p
        x = imgs.reshape(n, ch, h, p, h, p)
        return torch.einsum("nchpwq->nhwpqc", x).reshape(n, h * h, p * p * ch)

    def unpatchify(self, x: Tensor) -> Tensor:
        """(N, L, p*p*C) -> (N, C, H, W)."""
        p, ch = self.config.patch_size, self.config.in_chans
        h = int(round(x.shape[1] ** 0.5))
        x = x.reshape(x.shape[0], h, h, p, p, ch)
        return torch.einsum("nhwpqc->nchpwq", x).reshape(x.shape[0], ch, h * p, h * p)

    def mask_noise(self, n: int, *, generator: torch.Generator | None = None, device: torch.device | None = None) -> Tensor:
        """Uniform noise (N, L) that defines a mask; pass the same tensor again to get the same mask."""
        device = device if device is not None else self.cls_token.device
        return torch.rand(n, self.num_patches, generator=generator, device=device)

    def _keep_count(self, mask_ratio: float) -> int:
        if not 0.0 <= mask_ratio < 1.0:
            raise ValueError(f"mask_ratio must be in [0, 1), got {mask_ratio}")
        return max(1, int(round(self.num_patches * (1 - mask_ratio))))

    # ---- model ---------------------------------------------------------------------------------
    def forward_encoder(self, imgs: Tensor, mask_ratio: float, noise: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        x = self.patch_embed(imgs) + self.pos_embed
        n, length, d = x.shape
        keep = self._keep_count(mask_ratio)
        ids_shuffle = noise.argsort(dim=1)
        ids_restore = ids_shuffle.argsort(dim=1)
        ids_keep = ids_shuffle[:, :keep]
        x = x.gather(1, ids_keep[..., None].expand(-1, -1, d))
        mask = torch.ones(n, length, device=imgs.device, dtype=imgs.dtype)
        mask[:, :keep] = 0
        mask = mask.gather(1, ids_restore)  # 1 = masked (to be reconstructed)
        x = torch.cat([self.cls_token.expand(n, -1, -1).to(x.dtype), x], dim=1)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x), mask, ids_restore

    def forward_decoder(self, latent: Tensor, ids_restore: Tensor) -> Tensor:
        x = self.decoder_embed(latent)
        n, visible, d = x.shape[0], x.shape[1] - 1, x.shape[2]
        tokens = torch.cat([x[:, 1:], self.mask_token.to(x.dtype).expand(n, ids_restore.shape[1] - visible, -1)], dim=1)
        tokens = tokens.gather(1, ids_restore[..., None].expand(-1, -1, d))
        x = torch.cat([x[:, :1], tokens], dim=1) + torch.cat(
            [torch.zeros_like(self.decoder_pos_embed[:, :1]), self.decoder_pos_embed], dim=1).to(x.dtype)
        for blk in self.decoder_blocks:
            x = blk(x)
        return self.decoder_pred(self.decoder_norm(x))[:, 1:]

    def forward(self, imgs: Tensor, mask_ratio: float = 0.75, *, noise: Tensor | None = None,
                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Per-sample reconstruction loss (mean squared error on the masked patches), predicted
        patches (N, L, p*p*C) and the mask (N, L; 1 = masked). The mask comes from ``noise`` if
        given, else from ``generator`` (or the global RNG)."""
        if imgs.dim() != 4 or imgs.shape[1:] != (self.config.in_chans, self.config.img_size, self.config.img_size):
            raise ValueError(f"MAE expects images (N, {self.config.in_chans}, {self.config.img_size}, "
                             f"{self.config.img_size}), got {tuple(imgs.shape)}")
        if noise is None:
            noise = self.mask_noise(imgs.shape[0], generator=generator, device=imgs.device)
        latent, mask, ids_restore = self.forward_encoder(imgs, mask_ratio, noise)
        pred = self.forward_decoder(latent, ids_restore)
        return self.loss(imgs, pred, mask), pred, mask

    def loss(self, imgs: Tensor, pred: Tensor, mask: Tensor) -> Tensor:
        """Per-sample MSE over the masked patches (over all patches if none is masked)."""
        err = (pred - self.patchify(imgs)).pow(2).mean(-1)
        weight = mask if bool(mask.sum() > 0) else torch.ones_like(mask)
        return (err * weight).sum(1) / weight.sum(1).clamp_min(1)

    def reconstruct(self, imgs: Tensor, mask_ratio: float = 0.75, *, noise: Tensor | None = None,
                    generator: torch.Generator | None = None) -> Tensor:
        """The image with masked patches replaced by the model's prediction (for inspection)."""
        _, pred, mask = self(imgs, mask_ratio, noise=noise, generator=generator)
        patches = self.patchify(imgs)
        return self.unpatchify(patches * (1 - mask[..., None]) + pred * mask[..., None])


def build_mae(config: MAEConfig | dict | str = "small", *, fused_attn: bool = False) -> MaskedAutoencoder:
    """A :class:`MaskedAutoencoder` from a config, a dict of config fields, or a preset name."""
    if isinstance(config, str):
        config = mae_config(config)
    elif isinstance(config, dict):
        config = MAEConfig(**config)
    return MaskedAutoencoder(config, fused_attn=fused_attn)
