"""Colour jitter on the rank's device. The loader hands over uint8 clips and each clip's jitter
factors (drawn from the clip's own seed, so resume and worker count never change them); the float
conversion and the jitter run here, where they cost next to nothing instead of ~0.3 CPU-s a clip."""

from __future__ import annotations

import functools

import numpy as np
import torch

# ITU-R BT.601 luma weights: what "brightness" and "greyscale" mean for the contrast and saturation steps.
LUMA = (0.299, 0.587, 0.114)
NO_JITTER = (1.0, 1.0, 1.0)


def jitter_factors(rng: np.random.Generator, strength: float) -> tuple[float, float, float]:
    """Brightness, contrast and saturation factors for one clip, each uniform in [1 - s, 1 + s]."""
    if strength <= 0:
        return NO_JITTER
    b, c, s = rng.uniform(1 - strength, 1 + strength, 3)
    return float(b), float(c), float(s)


@functools.cache
def _luma_on(device: torch.device) -> torch.Tensor:
    """The luma weights on `device`, made once: a tensor built from a Python list per micro-batch is
    a blocking host-to-device copy on a GPU."""
    return torch.tensor(LUMA, device=device, dtype=torch.float32).view(1, 1, 3, 1, 1)


def to_model_input(
    video_u8: torch.Tensor, dtype: torch.dtype, factors: torch.Tensor | None = None
) -> torch.Tensor:
    """uint8 clips [B, T, 3, H, W] (already on the device) as `dtype` in [0, 1], each clip jittered by
    its row of `factors` [B, 3] (brightness, contrast, saturation; None = no jitter).

    The same operations as the CPU path had, in its order: scale, then contrast around the clip's
    mean luma (one pivot per clip, so its frames stay consistent with each other), then saturation
    around each pixel's grey. Computed in fp32 whatever `dtype` is: bf16 would quantise the pivot.
    """
    if video_u8.dim() != 5 or video_u8.shape[2] != 3:
        raise ValueError(f"expected uint8 clips [B, T, 3, H, W], got {tuple(video_u8.shape)}")
    x = video_u8.to(torch.float32).div_(255.0)
    if factors is not None:
        f = factors.to(device=x.device, dtype=torch.float32, non_blocking=True)
        if f.shape != (x.shape[0], 3):
            raise ValueError(f"jitter factors must be [{x.shape[0]}, 3], got {tuple(f.shape)}")
        brightness, contrast, saturation = (f[:, i].view(-1, 1, 1, 1, 1) for i in range(3))
        luma = _luma_on(x.device)
        x.mul_(brightness)
        pivot = (x * luma).sum(2, keepdim=True).mean(dim=(1, 2, 3, 4), keepdim=True)
        x.sub_(pivot).mul_(contrast).add_(pivot)
        grey = (x * luma).sum(2, keepdim=True)
        x.sub_(grey).mul_(saturation).add_(grey)
        x.clamp_(0.0, 1.0)
    return x.to(dtype).contiguous()
