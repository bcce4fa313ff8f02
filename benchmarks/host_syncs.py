"""Host reads of device values per optimizer step of the trainer's real `train_step` (one process,
accelerate + DeepSpeed on CPU), counted by hooking `Tensor.item`, `.tolist`, `bool()`, `.cpu()` and
host-to-device tensor creation (`torch.tensor`/`torch.as_tensor` with a `device=`). On a GPU each is
a point where the host waits for the device; on CPU the same calls are made, so they can be counted
here. Each read is attributed to its call site: the trainer's own apart from DeepSpeed's, and those
between a micro-batch's forward and its backward apart from the rest.

Counts the GPU presets' loop (bf16, where DeepSpeed skips a non-finite step: nothing read between
forward and backward) by default, in fp32 on CPU; `--guard micro-batch` counts the fp32 loop, which
reads each micro-batch's loss to skip it on every rank.

    .venv/bin/python benchmarks/host_syncs.py [--steps 6] [--zero 2] [--grad-accum 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _trainer_run import SyncCounter, build_trainer, write_run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--zero", type=int, choices=(1, 2, 3), default=2)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--guard", choices=("deepspeed-step", "micro-batch"), default="deepspeed-step")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(write_run(Path(tmp), args.zero, args.grad_accum, args.steps))
        trainer.learner.nonfinite_guard = args.guard
        counter = SyncCounter()
        counter.track_phases(trainer)
        trainer.train_step()  # warm-up: the first step builds DeepSpeed's buffers
        counter.install()
        counter.active = True
        try:
            for _ in range(args.steps):
                trainer.train_step()
        finally:
            counter.active = False
            counter.uninstall()
        trainer.rt.leave(trainer.learner.engine)
    print(
        f"host reads per optimizer step ({args.steps} steps, ZeRO-{args.zero}, grad_accum {args.grad_accum}, "
        f"guard {args.guard}):"
    )
    for (phase, owner, site), n in sorted(counter.per_step(args.steps).items()):
        print(f"  {n:5.2f}  {owner:9s} {phase:8s} {site}")
    print(
        json.dumps(
            {
                "zero": args.zero,
                "grad_accum": args.grad_accum,
                "guard": args.guard,
                **counter.totals(args.steps),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
