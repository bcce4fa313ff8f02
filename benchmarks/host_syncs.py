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
import collections
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

from trainer.config import load_config
from trainer.runtime import Runtime
from trainer.state import TrainState
from trainer.synthetic import make_synthetic
from trainer.train import Trainer


class SyncCounter:
    """Counts hooked calls by (phase, owner, call site) while `active`."""

    def __init__(self) -> None:
        self.active = False
        self.phase = "outside"  # "between" from a micro-batch's loss to its backward
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._inside = False
        self._saved: list[tuple[Any, str, Any]] = []

    def _site(self) -> tuple[str, str]:
        frames = traceback.extract_stack()[:-2]  # less this frame and the hook
        for owner, marker in (("deepspeed", "/deepspeed/"), ("trainer", "/trainer/")):
            for f in reversed(frames):
                if marker in f.filename and "benchmarks/" not in f.filename:
                    where = f"{Path(f.filename).name}:{f.lineno} {f.name}"
                    if owner == "deepspeed" or not any("/deepspeed/" in g.filename for g in frames):
                        return owner, where
        return "other", frames[-1].name if frames else "?"

    def _wrap(
        self, fn: Callable[..., Any], what: str, only: Callable[..., bool] | None = None
    ) -> Callable[..., Any]:
        def hooked(*args: Any, **kwargs: Any) -> Any:
            if self.active and not self._inside and (only is None or only(*args, **kwargs)):
                self._inside = True
                try:
                    owner, where = self._site()
                    self.counts[(self.phase, owner, f"{what} at {where}")] += 1
                finally:
                    self._inside = False
            return fn(*args, **kwargs)

        return hooked

    def install(self) -> None:
        for name in ("item", "tolist", "__bool__", "cpu"):
            self._patch(torch.Tensor, name, name)
        on_device = lambda *a, **k: k.get("device") is not None
        self._patch(torch, "tensor", "H2D torch.tensor", on_device)
        self._patch(torch, "as_tensor", "H2D torch.as_tensor", on_device)

    def _patch(self, owner: Any, name: str, what: str, only: Callable[..., bool] | None = None) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, self._wrap(original, what, only))

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)


def build(tmp: Path, zero: int, grad_accum: int, steps: int) -> Trainer:
    clips = tmp / "clips"
    make_synthetic(clips, clips=4, frames=8, height=64, width=64, seed=0)
    run = tmp / "run"
    run.mkdir()
    cfg = {
        "run": {"preset": "bench", "seed": 0},
        "topology": {"nodes": 1, "gpus_per_node": 1, "device": "cpu"},
        "data": {"source": str(clips), "frames": 8, "height": 64, "width": 64, "num_workers": 0},
        "optim": {"batch_per_gpu": 1, "grad_accum": grad_accum, "max_steps": 10 * steps, "warmup_steps": 0},
        "deepspeed": {"zero_stage": zero},
        # no log, validation or checkpoint inside the counted steps
        "schedule": {"log_every": 10**6, "val_every": 10**6, "checkpoint_every": 10**6},
    }
    (run / "run.toml").write_text(tomli_w.dumps(cfg))
    config = load_config(run / "run.toml")
    return Trainer(Runtime.start(run, config), config, TrainState())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--zero", type=int, choices=(1, 2, 3), default=2)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--guard", choices=("deepspeed-step", "micro-batch"), default="deepspeed-step")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build(Path(tmp), args.zero, args.grad_accum, args.steps)
        trainer.learner.nonfinite_guard = args.guard
        counter = SyncCounter()
        loss, engine = trainer.loss, trainer.learner.engine

        def loss_then_between(*a: Any, **k: Any) -> Any:
            out = loss(*a, **k)
            counter.phase = "between"
            return out

        backward = engine.backward

        def backward_then_outside(*a: Any, **k: Any) -> Any:
            counter.phase = "outside"
            return backward(*a, **k)

        trainer.loss = loss_then_between  # type: ignore[assignment]
        engine.backward = backward_then_outside
        trainer.train_step()  # warm-up: the first step builds DeepSpeed's buffers
        counter.install()
        counter.active = True
        try:
            for _ in range(args.steps):
                trainer.train_step()
        finally:
            counter.active = False
            counter.uninstall()
        trainer.rt.leave(engine)
    per_step = {k: v / args.steps for k, v in counter.counts.items()}
    print(
        f"host reads per optimizer step ({args.steps} steps, ZeRO-{args.zero}, grad_accum {args.grad_accum}, "
        f"guard {args.guard}):"
    )
    for (phase, owner, site), n in sorted(per_step.items()):
        print(f"  {n:5.2f}  {owner:9s} {phase:8s} {site}")
    totals: collections.Counter[str] = collections.Counter()
    for (phase, owner, _site), n in per_step.items():
        totals[f"{owner}_{phase}"] += n
    trainer_total = sum(n for (_p, owner, _s), n in per_step.items() if owner == "trainer")
    between = sum(n for (phase, _o, _s), n in per_step.items() if phase == "between")
    print(
        json.dumps(
            {
                "zero": args.zero,
                "grad_accum": args.grad_accum,
                "guard": args.guard,
                "trainer_per_step": round(trainer_total, 3),
                "between_forward_and_backward": round(between, 3),
                "deepspeed_per_step": round(
                    sum(n for (_p, o, _s), n in per_step.items() if o == "deepspeed"), 3
                ),
                **{k: round(v, 3) for k, v in sorted(totals.items())},
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
