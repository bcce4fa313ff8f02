"""Bytes moved and FLOPs per TAEHV training clip-step, counted per operator on the `meta` device.

One clip-step is the forward and backward of the reconstruction step the trainer runs (encode,
decode, MSE against the input frames in fp32) for one bf16 clip, batch 1 (every count is linear in
the batch). Every aten operator the eager step dispatches is counted by a TorchDispatchMode: the
bytes it reads (each input's distinct elements) and writes (its outputs). Views move nothing; an
allocation moves nothing until something writes it. This is what eager PyTorch asks of memory, each
operator one kernel, before any fusion; the FLOPs come from torch.utils.flop_counter. On `meta`
nothing is computed, so a 12x480x720 count takes a second on any machine.

    .venv/bin/python benchmarks/memory_traffic.py [--size 480x720] [--frames 12]
    .venv/bin/python benchmarks/memory_traffic.py --baseline    # the model as published, unreordered

It prints a table per layout (eager NCHW, eager channels_last) grouped by kind of operator, then one
JSON line per layout with the totals.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.frame_ops import is_channels_last
from trainer.model import TAEHV, reconstruction_target

aten = torch.ops.aten

GROUPS = {
    "conv": {"convolution", "convolution_backward"},
    "copies/cat": {
        "cat",
        "clone",
        "copy_",
        "_to_copy",
        "zero_",
        "fill_",
        "zeros_like",
        "new_zeros",
        "slice_backward",
        "constant_pad_nd",
        "index_put_",
    },
    "upsample": {"upsample_nearest2d", "upsample_nearest2d_backward"},
}
# Reading the destination is no part of these: they only write it.
WRITE_ONLY = {"copy_", "zero_", "fill_"}
# Allocations and metadata: nothing moves until an operator writes the memory.
FREE = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach", "alias"}


def group_of(op: str) -> str:
    return next((g for g, ops in GROUPS.items() if op in ops), "elementwise/other")


def distinct_bytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor addresses (an expanded dimension reads its element once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


def _as_cudnn_layout(name: str, out):
    """cuDNN's layout for a convolution over an NHWC activation: its output (forward) or the gradient
    of its input (backward) is NHWC too. The meta kernels return NCHW there, which would hide every
    layout copy channels_last costs; the conversion runs below this mode, so it is not counted."""
    if name == "convolution":
        return out.contiguous(memory_format=torch.channels_last)
    grad_input, *rest = out
    if grad_input is not None:
        grad_input = grad_input.contiguous(memory_format=torch.channels_last)
    return (grad_input, *rest)


@dataclass
class OpCount:
    calls: int = 0
    read: int = 0
    written: int = 0


@dataclass
class TrafficCounter(TorchDispatchMode):
    """Per aten operator: calls, bytes read, bytes written."""

    ops: dict[str, OpCount] = field(default_factory=lambda: defaultdict(OpCount))

    def __post_init__(self) -> None:
        super().__init__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in GROUPS["conv"] and is_channels_last(args[0]):
            out = _as_cudnn_layout(name, out)
        if func.is_view or name in FREE or name.startswith("_unsafe_view"):
            return out
        inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        if name in WRITE_ONLY:
            inputs = inputs[1:]  # the destination
        outputs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        c = self.ops[name]
        c.calls += 1
        c.read += sum(distinct_bytes(t) for t in inputs)
        c.written += sum(t.numel() * t.element_size() for t in outputs)
        return out

    def by_group(self) -> dict[str, int]:
        totals: dict[str, int] = defaultdict(int)
        for name, c in self.ops.items():
            totals[group_of(name)] += c.read + c.written
        return dict(totals)

    @property
    def total(self) -> int:
        return sum(c.read + c.written for c in self.ops.values())


def clip_step(model: TAEHV, frames: int, h: int, w: int, batch: int = 1) -> None:
    """The trainer's reconstruction step on `model`'s device: bf16 activations, fp32 MSE, backward."""
    x = torch.rand(batch, frames, 3, h, w, device="meta", dtype=torch.bfloat16)
    _z, y = model(x, clamp=False)
    loss = F.mse_loss(y.float(), reconstruction_target(x, y.shape[1]).float())
    loss.backward()


def count(
    frames: int, h: int, w: int, channels_last: bool, baseline: bool = False, batch: int = 1
) -> tuple[TrafficCounter, int]:
    """(traffic per operator, FLOPs) of one training step of `batch` clips, counted on meta."""
    with torch.device("meta"):
        model = TAEHV().to(torch.bfloat16).train()
    if channels_last:
        model.use_channels_last()
    model.use_published_order(baseline)
    counter = TrafficCounter()
    flops = FlopCounterMode(display=False)
    with flops, counter:
        clip_step(model, frames, h, w, batch)
    return counter, flops.get_total_flops()


def report(layout: str, counter: TrafficCounter, flops: int, args) -> dict:
    gb = 1e9
    print(f"== eager {layout}, {args.frames}x{args.size}, batch 1, bf16, forward+backward")
    print(f"  {'operator':32s} {'calls':>6s} {'read GB':>9s} {'write GB':>9s} {'total GB':>9s}")
    groups = counter.by_group()
    for g in sorted(groups, key=groups.get, reverse=True):
        rows = sorted(
            ((n, c) for n, c in counter.ops.items() if group_of(n) == g),
            key=lambda nc: nc[1].read + nc[1].written,
            reverse=True,
        )
        print(f"  [{g}] {groups[g] / gb:.2f} GB")
        for n, c in rows:
            print(
                f"    {n:30s} {c.calls:6d} {c.read / gb:9.2f} {c.written / gb:9.2f} {(c.read + c.written) / gb:9.2f}"
            )
    print(
        f"  total {counter.total / gb:.2f} GB, {flops / 1e12:.2f} TFLOP ({flops / counter.total:.0f} FLOP/byte)"
    )
    return {
        "layout": layout,
        "model": "published order" if args.baseline else "optimised",
        "frames": args.frames,
        "size": args.size,
        "batch": 1,
        "bytes": counter.total,
        "gb": round(counter.total / gb, 2),
        "gb_by_group": {g: round(v / gb, 2) for g, v in sorted(groups.items())},
        "tflop": round(flops / 1e12, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="480x720", help="HxW, multiples of 8")
    ap.add_argument("--frames", type=int, default=12, help="a multiple of 4")
    ap.add_argument("--baseline", action="store_true", help="count the layers in the published order")
    args = ap.parse_args()
    h, w = map(int, args.size.split("x"))
    if h % 8 or w % 8 or args.frames % 4:
        ap.error(f"--size {args.size} --frames {args.frames}: sizes must be multiples of 8, frames of 4")
    lines = []
    for layout, cl in (("NCHW", False), ("channels_last", True)):
        counter, flops = count(args.frames, h, w, cl, args.baseline)
        lines.append(report(layout, counter, flops, args))
    for line in lines:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
