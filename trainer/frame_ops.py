"""Tensor operations on video frames folded into the batch (N*T, C, H, W), in NCHW or channels_last:
frames in and out of channels, and a MemBlock's input beside its previous frame. The model's layers
(trainer/model.py) run on these; each keeps its input's memory layout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def is_channels_last(x: torch.Tensor) -> bool:
    return x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def frames_to_channels(x: torch.Tensor, s: int) -> torch.Tensor:
    """(N*T, C, H, W) -> (N*T/s, s*C, H, W), s consecutive frames stacked along channels, in x's layout.

    A view in NCHW. In channels_last, one permuted copy straight into channels_last (a plain
    reshape would copy to NCHW and a second copy would bring it back); its gradient is one copy too.
    """
    nt, c, h, w = x.shape
    if s == 1:
        return x
    if not is_channels_last(x):
        return x.reshape(nt // s, s * c, h, w)
    nhwc = x.permute(0, 2, 3, 1).reshape(nt // s, s, h, w, c).permute(0, 2, 3, 1, 4)
    return nhwc.reshape(nt // s, h, w, s * c).permute(0, 3, 1, 2)


def channels_to_frames(x: torch.Tensor, s: int) -> torch.Tensor:
    """(N*T, s*C, H, W) -> (N*T*s, C, H, W): the inverse of frames_to_channels, with the same costs."""
    nt, sc, h, w = x.shape
    if s == 1:
        return x
    if not is_channels_last(x):
        return x.reshape(nt * s, sc // s, h, w)
    nhwc = x.permute(0, 2, 3, 1).reshape(nt, h, w, s, sc // s).permute(0, 3, 1, 2, 4)
    return nhwc.reshape(nt * s, h, w, sc // s).permute(0, 3, 1, 2)


class CatPast(torch.autograd.Function):
    """cat([x, past], channels) for a MemBlock, past being each frame's predecessor in its own video
    (zeros for frame 0), written straight into one buffer in x's layout.

    The same values as torch.cat([x, shift_one_frame(x, n)], 1) for about half the memory traffic:
    no zero-filled copy of x and no second copy into the cat, and a backward that adds the two
    halves of the gradient in one pass (autograd's would clone, zero-fill and add). Saves no tensor.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, n: int) -> torch.Tensor:
        nt, c, h, w = x.shape
        t = nt // n
        fmt = torch.channels_last if is_channels_last(x) else torch.contiguous_format
        ctx.n, ctx.fmt = n, fmt
        if torch.compiler.is_compiling():
            # The published operators, which the compiler fuses into one write of the output. Not
            # the `empty` buffer filled in place below: Inductor's CPU code for it, fused with the
            # convolution before it, filled the buffer with NaN in a single-threaded process
            # (torch 2.13, an AVX-512 Xeon; tests/trainer/test_compile.py): every loss non-finite.
            return torch.cat([x, shift_one_frame(x, n)], 1).contiguous(memory_format=fmt)
        out = torch.empty((nt, 2 * c, h, w), dtype=x.dtype, device=x.device, memory_format=fmt)
        out[:, :c] = x
        out5 = out.view(n, t, 2 * c, h, w)
        out5[:, 1:, c:] = x.view(n, t, c, h, w)[:, :-1]
        out5[:, :1, c:].zero_()
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        n, fmt = ctx.n, ctx.fmt
        nt, c2, h, w = grad.shape
        c, t = c2 // 2, nt // n
        g5 = grad.reshape(n, t, c2, h, w)
        # frame i's gradient: its own half of the cat, plus the past half of frame i+1
        if torch.compiler.is_compiling():  # one fused kernel; functional, as in forward
            both = torch.cat([g5[:, :-1, :c] + g5[:, 1:, c:], g5[:, -1:, :c]], 1)
            return both.reshape(nt, c, h, w).contiguous(memory_format=fmt), None
        gx = torch.empty((nt, c, h, w), dtype=grad.dtype, device=grad.device, memory_format=fmt)
        gx5 = gx.view(n, t, c, h, w)
        torch.add(g5[:, :-1, :c], g5[:, 1:, c:], out=gx5[:, :-1])
        gx5[:, -1:] = g5[:, -1:, :c]
        return gx, None


def same_layout(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`out` in channels_last when `like` is (the published order's second copy; see model.apply_published)."""
    return out.contiguous(memory_format=torch.channels_last) if is_channels_last(like) else out


def shift_one_frame(x: torch.Tensor, n: int) -> torch.Tensor:
    """For x of shape (N*T, C, H, W): each frame's predecessor in its own video; zeros for frame 0.
    Keeps x's memory layout (frames are whole blocks of memory in NCHW and NHWC alike)."""
    nt, c, h, w = x.shape
    past = torch.zeros_like(x)
    past.view(n, nt // n, c, h, w)[:, 1:] = x.view(n, nt // n, c, h, w)[:, :-1]
    return past


def drop_leading_frames(x: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """(N*T, C, H, W) of n videos -> (N*(T-k), C, H, W): each video's first k frames dropped, in x's
    layout. A view for one video; for several, one copy (and one for the gradient)."""
    if k == 0:
        return x
    if is_channels_last(x):
        nhwc = x.permute(0, 2, 3, 1)
        out = nhwc.unflatten(0, (n, -1))[:, k:].flatten(0, 1).permute(0, 3, 1, 2)
        return out.contiguous(memory_format=torch.channels_last)  # one kept frame each: a strided view
    return x.unflatten(0, (n, -1))[:, k:].flatten(0, 1).contiguous()


def keep_frames(x: torch.Tensor, n: int, index: list[int]) -> torch.Tensor:
    """(N*T, C, H, W) of n videos -> (N*len(index), C, H, W): the frames at `index` of each video, in
    x's layout (one copy). For a decoder whose warm-up frames are not only the first ones (H3's chunks)."""
    if is_channels_last(x):
        nhwc = x.permute(0, 2, 3, 1).unflatten(0, (n, -1))[:, index].flatten(0, 1)
        return nhwc.permute(0, 3, 1, 2)  # the gathered NHWC copy: channels_last
    return x.unflatten(0, (n, -1))[:, index].flatten(0, 1)


# CUDA's nearest-upsample kernels index with 32-bit integers and refuse a tensor of 2**31 elements
# or more: at 480x720 that is 64 channels over more than 96 frames, a batch of 9 twelve-frame clips.
_MAX_KERNEL_NUMEL = 2**31 - 1


def _in_pieces(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, out_per_item: int
) -> torch.Tensor:
    """fn(x), or fn over slices of x's batch whose outputs stay under the kernels' 32-bit limit."""
    if x.shape[0] * out_per_item <= _MAX_KERNEL_NUMEL or x.shape[0] < 2:
        return fn(x)
    return torch.cat([fn(p) for p in x.split(max(1, _MAX_KERNEL_NUMEL // out_per_item))])


class _NearestUp(torch.autograd.Function):
    """Nearest upsampling by an integer scale whose gradient is a pooled sum of each scale x scale
    block. Autograd's own gradient for it scatters with atomic adds, and Inductor compiles that
    as `new_zeros` + `_unsafe_index_put`: 31 ms of a 216 ms compiled step on an H100 at batch 8
    (benchmarks/gpu_throughput.py's profile), for what is a read of the gradient and a quarter-size
    write. avg_pool2d x scale² is that sum exactly (dividing by a power of two is exact)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: int) -> torch.Tensor:
        ctx.scale = scale
        if torch.compiler.is_compiling():
            return repeat_pixels(x, scale)  # one generated kernel either way, and no autocast in it

        def up(t: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.interpolate(t, scale_factor=scale, mode="nearest")

        return _in_pieces(up, x, x[0].numel() * scale * scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        s = ctx.scale

        def pool(g: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.avg_pool2d(g, s) * (s * s)

        return _in_pieces(pool, grad, grad[0].numel()), None


def repeat_pixels(x: torch.Tensor, scale: int) -> torch.Tensor:
    """Nearest upsampling by an integer scale as a broadcast view and one copy, in x's layout: the
    same values as interpolate(mode="nearest"), from operators autocast leaves in x's dtype."""
    n, c, h, w = x.shape
    if is_channels_last(x):
        nhwc = x.permute(0, 2, 3, 1)[:, :, None, :, None, :].expand(n, h, scale, w, scale, c)
        return nhwc.reshape(n, h * scale, w * scale, c).permute(0, 3, 1, 2)
    return x[:, :, :, None, :, None].expand(n, c, h, scale, w, scale).reshape(n, c, h * scale, w * scale)


def upsample_nearest(x: torch.Tensor, scale: int) -> torch.Tensor:
    """Nearest-neighbour upsampling by an integer `scale`, in x's dtype and layout.

    Autocast lists the upsample operators as float32 ones, so under bf16 autocast nn.Upsample casts
    its input to float32, writes a float32 output twice the size, and the next convolution casts it
    back (on an H100, 7 ms of float32 upsample kernels and part of 15 ms of copies in a 139 ms eager
    step at batch 4). Repeating pixels is exact in any dtype, so autocast stays out of it. A batch
    whose output would pass the kernels' 32-bit limit is upsampled in pieces; the gradient is a
    pooled sum (_NearestUp).
    """
    if scale == 1:
        return x
    device = x.device.type
    # Compiled, _NearestUp repeats pixels with operators autocast does not touch, so the stage's
    # graph holds no autocast region: AOTAutograd's cache passes over a graph that enters one
    # (torch 2.13), and every process would trace the decoder's upsampling stages again.
    if device in ("cuda", "cpu") and torch.is_autocast_enabled(device) and not torch.compiler.is_compiling():
        with torch.autocast(device, enabled=False):
            return _NearestUp.apply(x, scale)
    return _NearestUp.apply(x, scale)  # no autocast here (or a device it has none for, as meta)
