"""Image-quality metrics for reconstructions in [0, 1] (PSNR from the MSE, SSIM), and training
metrics kept on the device between log steps."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F


def psnr_from_mse(mse: float) -> float:
    """PSNR in dB for signals in [0, 1]; a perfect reconstruction is capped at 100 dB."""
    if not math.isfinite(mse):
        return float("nan")
    return 100.0 if mse <= 1e-10 else 10.0 * math.log10(1.0 / mse)


def _gaussian_window(
    size: int, sigma: float, channels: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
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


class DeviceMetrics:
    """Training metrics summed where they are computed, between log steps.

    Adding a loss never waits for the device (no `.item()` between forward and backward); at a log
    step one all-reduce turns the sums into means over ranks and micro-batches. Every rank must
    add the same keys and call `reduce` at the same steps.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._reset()

    def _reset(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.micro_batches = 0
        self.grad_norm_sum: torch.Tensor | None = None
        self.steps = 0
        self.seconds = 0.0

    def add_micro_batch(self, values: dict[str, torch.Tensor]) -> None:
        for key, value in values.items():
            value = value.detach().float().reshape(())
            self.sums[key] = value if key not in self.sums else self.sums[key] + value
        self.micro_batches += 1

    def add_step(self, grad_norm: torch.Tensor | float | None, seconds: float) -> None:
        """One optimizer step: its global gradient norm (tensor, float or None) and host seconds."""
        self.steps += 1
        self.seconds += seconds
        if grad_norm is not None:
            g = torch.as_tensor(grad_norm, dtype=torch.float32).reshape(()).to(self.device, non_blocking=True)
            self.grad_norm_sum = g if self.grad_norm_sum is None else self.grad_norm_sum + g

    def reduce(self, world: int) -> tuple[dict[str, float], float | None, float]:
        """(means by key, mean gradient norm or None, mean step seconds) since the last reduce;
        collective when world > 1."""

        keys = sorted(self.sums)
        values = [self.sums[k].to(self.device) for k in keys]
        if self.grad_norm_sum is not None:
            values.append(self.grad_norm_sum)
        out = torch.stack(values).to(torch.float64) if values else torch.zeros(0, dtype=torch.float64)
        if world > 1:
            dist.all_reduce(out)
        got = out.tolist()  # the single host synchronisation of a log interval
        per = max(1, self.micro_batches) * world
        means = {k: v / per for k, v in zip(keys, got)}
        grad_norm = got[-1] / (max(1, self.steps) * world) if self.grad_norm_sum is not None else None
        step_time = self.seconds / max(1, self.steps)
        self._reset()
        return means, grad_norm, step_time
