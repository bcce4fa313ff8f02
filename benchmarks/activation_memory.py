"""Peak memory of one training step per clip, with and without activation checkpointing.

On CPU it measures peak RSS growth (each case in a fresh process); on a GPU, torch's peak
allocated memory. Activations grow linearly with pixels × frames, so the figure is measured at
the given size and scaled to 12×480×720 to answer: does per-GPU batch 8 fit in 80 GB?

    .venv/bin/python benchmarks/activation_memory.py [--size 120x176] [--frames 12] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(frames: int, h: int, w: int, ckpt: bool, device: str, batch: int) -> dict:
    sys.path.insert(0, str(ROOT))
    import torch

    from trainer.model import TAEHV, reconstruction_target

    model = TAEHV(activation_checkpointing=ckpt).to(device).train()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model.to(dtype)
    x = torch.rand(batch, frames, 3, h, w, device=device, dtype=dtype)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    _z, y = model(x)
    loss = torch.nn.functional.mse_loss(y.float(), reconstruction_target(x, y.shape[1]).float())
    loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"bytes_per_clip": peak / batch}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="120x176")
    ap.add_argument("--frames", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ckpt", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    h, w = map(int, args.size.split("x"))
    if h % 8 or w % 8:
        ap.error(f"--size {args.size}: height and width must be multiples of 8 (the encoder downscales 8x)")
    if args.child:
        print(json.dumps(measure(args.frames, h, w, args.ckpt, args.device, args.batch)))
        return
    results = {}
    for ckpt in (False, True):
        cmd = [
            sys.executable,
            __file__,
            "--child",
            "--size",
            args.size,
            "--frames",
            str(args.frames),
            "--device",
            args.device,
            "--batch",
            str(args.batch),
        ] + (["--ckpt"] if ckpt else [])
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        results[ckpt] = json.loads(out)["bytes_per_clip"]
    scale = (12 * 480 * 720) / (args.frames * h * w)
    # an H100 run is bf16: activations take half the bytes of the fp32 CPU measurement
    to_gpu = 1.0 if args.device == "cuda" else 0.5
    state_gb = 11_315_539 * (2 + 4 + 4 + 8) / 1e9  # bf16 weights, fp32 grads, fp32 master, Adam m and v
    kind = "GPU allocated" if args.device == "cuda" else "CPU RSS, fp32"
    print(f"peak {kind} per clip at {args.frames}x{h}x{w} ({args.device}, batch {args.batch}):")
    for ckpt, label in (
        (False, "without activation checkpointing"),
        (True, "with activation checkpointing   "),
    ):
        per = results[ckpt]
        at_full = per * scale * to_gpu / 1e9
        total = 8 * at_full + state_gb
        fits = "fits" if total < 80 else "does NOT fit"
        print(
            f"  {label}: {per / 1e6:9.1f} MB/clip measured -> {at_full:6.2f} GB/clip at 12x480x720 bf16; "
            f"batch 8 + weights/grads/Adam = {total:6.1f} GB ({fits} in 80 GB)"
        )
    print(f"  checkpointing saves {100 * (1 - results[True] / results[False]):.0f}% of activation memory")


if __name__ == "__main__":
    main()
