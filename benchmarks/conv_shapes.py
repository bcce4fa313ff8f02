"""Where a training step's convolution time goes: every distinct convolution of TAEHV's step at a
clip size, timed alone (forward, and backward for the weight and, where the step needs it, the
input) in channels_last, and again with its channel counts padded to a multiple of 8 where they
are not. One JSON object a line.

    python3 benchmarks/conv_shapes.py [--size 12x480x720] [--batch 8] [--out DIR]
    python3 benchmarks/conv_shapes.py --device cpu --tiny          # CI's smoke run

On an H100 the compiled step at batch 8 spent 64 % of its 216 ms in convolutions, at about 350
TFLOP/s, and four of its largest convolution kernels were cuDNN's sm80/CUTLASS fallbacks rather than
Hopper kernels: probably the two convolutions with 3 channels (the image in, the image out), since
tensor-core kernels want channel counts in multiples of 8. This says which shapes cost what, and
whether padding the 3-channel ones (zero channels in, extra output channels sliced off) pays.

The shapes come from one forward of the model on the `meta` device (nothing computed), through
forward hooks on every nn.Conv2d. A convolution whose input needs no gradient (the first, on the
image) is timed without the input's gradient, as the step runs it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.model import TAEHV

# (batch N, in C, out, kernel, stride, padding, H, W, bias, input needs grad)
Shape = tuple[int, int, int, int, int, int, int, int, bool, bool]


def conv_shapes(frames: int, h: int, w: int, batch: int) -> Counter[Shape]:
    """Each distinct convolution of one training forward at this clip size, with its call count."""
    seen: Counter[Shape] = Counter()

    def hook(mod: nn.Module, inputs: tuple[torch.Tensor, ...], _out: torch.Tensor) -> None:
        assert isinstance(mod, nn.Conv2d)
        x = inputs[0]
        n, c, hh, ww = x.shape
        k, s, p = mod.kernel_size[0], mod.stride[0], mod.padding
        pad = p[0] if isinstance(p, tuple) else 0
        seen[(n, c, mod.out_channels, k, s, int(pad), hh, ww, mod.bias is not None, x.requires_grad)] += 1

    with torch.device("meta"):
        model = TAEHV().train()
        handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Conv2d)]
        x = torch.rand(batch, frames, 3, h, w)
        model(x, clamp=False)
    for handle in handles:
        handle.remove()
    return seen


def _round8(c: int) -> int:
    return int(math.ceil(c / 8) * 8)


def _timer(device: str) -> Callable[[Callable[[], None], int, int], float]:
    def timed(fn: Callable[[], None], warmup: int, steps: int) -> float:
        for _ in range(warmup):
            fn()
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / steps
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        return (time.perf_counter() - t0) * 1e3 / steps

    return timed


def time_shape(shape: Shape, c_in: int, c_out: int, args: argparse.Namespace) -> dict[str, float]:
    """ms of the forward and of the backward of one call, with `c_in` / `c_out` channels (the
    shape's own, or padded); the output is sliced back to the shape's own channels."""
    n, _c, out, k, s, pad, h, w, bias, input_grad = shape
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    dev = args.device
    x = torch.randn(n, c_in, h, w, device=dev, dtype=dtype).contiguous(memory_format=torch.channels_last)
    x.requires_grad_(input_grad)
    weight = torch.randn(c_out, c_in, k, k, device=dev, dtype=dtype, requires_grad=True)
    b = torch.zeros(c_out, device=dev, dtype=dtype, requires_grad=True) if bias else None
    y = F.conv2d(x, weight, b, s, pad)[:, :out]
    grad = torch.randn_like(y)
    timed = _timer(dev)

    def forward() -> None:
        F.conv2d(x, weight, b, s, pad)

    def step() -> None:
        F.conv2d(x, weight, b, s, pad)[:, :out].backward(grad)

    with torch.backends.cudnn.flags(enabled=True, benchmark=True):
        fwd = timed(forward, args.warmup, args.steps)
        both = timed(step, args.warmup, args.steps)
    return {"fwd_ms": fwd, "bwd_ms": max(0.0, both - fwd)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="12x480x720", help="frames x height x width of a clip")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="a tiny clip, 1 timed step: CI's smoke run")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", type=Path, help="append the lines to OUT/results.jsonl too")
    args = p.parse_args(argv)
    frames, h, w = (4, 32, 48) if args.tiny else tuple(int(v) for v in args.size.split("x"))
    if args.tiny:
        args.batch, args.steps, args.warmup = 1, 1, 1
    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"section": "convs", "skipped": "no CUDA"}))
        return 0
    args.bf16 = args.device == "cuda"
    sink = (args.out / "results.jsonl").open("a") if args.out else None

    def emit(**fields: Any) -> None:
        line = json.dumps({"section": "convs", **fields})
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")
            sink.flush()

    shapes = conv_shapes(frames, h, w, args.batch)
    total = padded_total = 0.0
    for shape, calls in sorted(shapes.items(), key=lambda kv: -kv[1] * kv[0][0] * kv[0][6] * kv[0][7]):
        n, c, out, k, s, pad, hh, ww, _bias, input_grad = shape
        own = time_shape(shape, c, out, args)
        per_call = own["fwd_ms"] + own["bwd_ms"]
        ho, wo = (hh + 2 * pad - k) // s + 1, (ww + 2 * pad - k) // s + 1
        flop = 2 * n * out * ho * wo * c * k * k * (3 if input_grad else 2)  # fwd, wgrad(, dgrad)
        line: dict[str, Any] = {
            "in": c,
            "out": out,
            "kernel": k,
            "stride": s,
            "input": [n, c, hh, ww],
            "calls": calls,
            "input_grad": input_grad,
            "fwd_ms": round(own["fwd_ms"], 3),
            "bwd_ms": round(own["bwd_ms"], 3),
            "ms_per_step": round(calls * per_call, 2),
            "tflops": round(flop / (per_call / 1e3) / 1e12, 1) if per_call > 0 else None,
        }
        padded_ms = calls * per_call
        if c % 8 or out % 8:
            pad_in, pad_out = _round8(c), _round8(out)
            padded = time_shape(shape, pad_in, pad_out, args)
            padded_ms = calls * (padded["fwd_ms"] + padded["bwd_ms"])
            line.update(padded_to=[pad_in, pad_out], padded_ms_per_step=round(padded_ms, 2))
        total += calls * per_call
        padded_total += min(padded_ms, calls * per_call)
        emit(**line)
    emit(
        what="every convolution of a step",
        clip=f"{frames}x{h}x{w}",
        batch=args.batch,
        distinct=len(shapes),
        calls=sum(shapes.values()),
        ms_per_step=round(total, 1),
        ms_per_step_padding_where_it_pays=round(padded_total, 1),
    )
    if sink:
        sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
