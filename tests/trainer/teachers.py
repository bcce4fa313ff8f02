"""Tiny random teachers of every family's diffusers class, saved with save_pretrained as a user would:
the real classes of diffusers 0.42.1 with the published models' geometry (latent channels, space and
time compression, Wan 2.2's patch 2 and residual blocks, LTX-2's 'spatial'/'temporal'/'spatiotemporal'
downsamplers, H3's 17-frame chunks) at a few thousand to a few million parameters."""

from __future__ import annotations

from pathlib import Path

from tests.trainer.conftest import save_tiny_teacher, save_tiny_wan


def _save(directory: Path, class_name: str, seed: int = 0, **config: object) -> Path:
    import diffusers
    import torch

    torch.manual_seed(seed)
    getattr(diffusers, class_name)(**config).save_pretrained(directory)
    return directory


def save_tiny_wan22(directory: Path, seed: int = 0) -> Path:
    """Wan 2.2 TI2V 5B's VAE in small: z_dim 48, residual blocks, a 2x2 patchify in front (12 input
    channels) and 8x of its own: 16x space, 4x time."""
    return _save(
        directory,
        "AutoencoderKLWan",
        seed,
        base_dim=8,
        z_dim=48,
        dim_mult=[1, 2, 2, 2],
        num_res_blocks=1,
        is_residual=True,
        patch_size=2,
        in_channels=12,
        out_channels=12,
        scale_factor_spatial=16,
        latents_mean=[0.0] * 48,
        latents_std=[1.0] * 48,
    )


def save_tiny_hv15(directory: Path, seed: int = 0) -> Path:
    """HunyuanVideo 1.5's VAE in small: 32 latent channels, 16x space, 4x time (its encoder's last
    width must be a multiple of 2 x 32)."""
    return _save(
        directory,
        "AutoencoderKLHunyuanVideo15",
        seed,
        block_out_channels=(8, 16, 32, 64, 64),
        layers_per_block=1,
        latent_channels=32,
    )


def save_tiny_cogvideox(directory: Path, seed: int = 0) -> Path:
    return _save(
        directory,
        "AutoencoderKLCogVideoX",
        seed,
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        norm_num_groups=4,
        latent_channels=16,
    )


def save_tiny_ltx2(directory: Path, seed: int = 0) -> Path:
    """LTX-2's VAE in small: 128 latent channels, patch 4 and three downsamplers: 32x space, 8x time."""
    return _save(
        directory,
        "AutoencoderKLLTX2Video",
        seed,
        block_out_channels=(8, 16, 32, 64),
        decoder_block_out_channels=(8, 16, 32),
        layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1),
        latent_channels=128,
        spatial_compression_ratio=32,
        temporal_compression_ratio=8,
    )


def save_tiny_h3(directory: Path, seed: int = 0) -> Path:
    """MiniMax H3's VAE in small: 24 latent channels, 16x space, 4x time, 17-frame chunks, 3 latents
    dropped; a one-layer ViT decoder."""
    return _save(
        directory,
        "AutoencoderKLMiniMaxH3",
        seed,
        block_out_channels=(8, 8, 8, 16, 16, 16),
        layers_per_block=1,
        norm_num_groups=4,
        decoder_num_layers=1,
        decoder_num_attention_heads=2,
        decoder_attention_head_dim=8,
        decoder_num_register_tokens=1,
        latent_channels=24,
    )


# the teacher each base family distils from (a _super family shares its base's)
SAVERS = {
    "taehv": save_tiny_teacher,
    "taew2_1": save_tiny_wan,
    "taew2_2": save_tiny_wan22,
    "taehv1_5": save_tiny_hv15,
    "taecvx": save_tiny_cogvideox,
    "taeltx_2": save_tiny_ltx2,
    "taeh3": save_tiny_h3,
}


class TinyTeachers:
    """Each family's tiny teacher, saved on first use into one session directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._dirs: dict[str, Path] = {}

    def __call__(self, family: str) -> Path:
        base = family.removesuffix("_super")
        base = "taeltx_2" if base.startswith("taeltx") else base
        if base not in self._dirs:
            self._dirs[base] = SAVERS[base](self.root / base)
        return self._dirs[base]
