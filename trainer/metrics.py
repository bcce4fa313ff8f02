"""Image-quality metrics for reconstructions in [0, 1]: PSNR from the MSE, and SSIM."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def psnr_from_mse(mse: float) -> float:
    """PSNR in dB for signals in [0, 1]; a perfect reconstruction is capped at 100 dB."""
    if not math.isfinite(mse):
        return float("nan")
    return 100.0 if mse <= 1e-10 else 10.0 * math.log10(1.0 / mse)


def _gaussian_window(size: int, sigma: float, channels: int, device, dtype) -> torch.Tensor:
    coords = torch.arange(size, device=device, dtype=dtype) - (size - 1) / 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    g = g / g.sum()
    return (g[:, None] * g[None, :]).expand(channels, 1, size, size).contiguous()


def ssim_per_frame(x: torch.Tensor, y: torch.Tensor, window: int = 11, sigma: float = 1.5) -> torch.Tensor:
    """Mean SSIM of each image pair (Wang et al. 2004, Gaussian window, K1=0.01, K2=0.03).

    x, y: (..., C, H, W) in [0, 1]. Returns a tensor of shape (...). Images smaller than the
    window use a window shrunk to fit (odd size).
    """
    lead = x.shape[:-3]
    c, h, w = x.shape[-3:]
    x = x.reshape(-1, c, h, w).float()
    y = y.reshape(-1, c, h, w).float()
    size = min(window, h if h % 2 else h - 1, w if w % 2 else w - 1)
    k = _gaussian_window(size, sigma, c, x.device, x.dtype)

    def blur(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, k, groups=c)

    mu_x, mu_y = blur(x), blur(y)
    sxx = blur(x * x) - mu_x**2
    syy = blur(y * y) - mu_y**2
    sxy = blur(x * y) - mu_x * mu_y
    c1, c2 = 0.01**2, 0.03**2
    s = ((2 * mu_x * mu_y + c1) * (2 * sxy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (sxx + syy + c2))
    return s.mean(dim=(1, 2, 3)).reshape(lead)
