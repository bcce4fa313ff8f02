"""What the trainer carries across a checkpoint besides DeepSpeed's own state, and the LR schedule
that is a function of it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trainer.config import TrainConfig


def lr_at(step: int, cfg: TrainConfig) -> float:
    """LR for optimizer step `step` (0-based): linear warmup, then the schedule. A function of the
    optimizer step only, so it is the same for any number of processes and across resume."""
    o = cfg.optim
    if o.warmup_steps and step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    if o.schedule == "constant":
        return o.lr
    span = max(1, o.max_steps - o.warmup_steps)
    progress = min(1.0, (step - o.warmup_steps) / span)
    floor = o.lr * o.min_lr_ratio
    if o.schedule == "linear":
        return floor + (o.lr - floor) * (1 - progress)
    return floor + (o.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class TrainState:
    """The trainer's progress. `state_dict` is what a checkpoint's trainer/state.json carries (with
    the world size and preset the checkpoint manager adds); `samples_consumed` is per rank and
    travels in the rank's own state file instead."""

    step: int = 0
    samples_consumed: int = 0  # sampler items this rank has taken (a clip's crops are one)
    nonfinite_skipped: int = 0
    data_skipped: int = 0
    best_psnr: float = -math.inf
    last_val: dict[str, Any] | None = None
    last_saved_step: int = -1

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "best_psnr": self.best_psnr if math.isfinite(self.best_psnr) else None,
            "nonfinite_skipped": self.nonfinite_skipped,
            "data_skipped": self.data_skipped,
            "last_val": self.last_val,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.best_psnr = state.get("best_psnr") or -math.inf
        self.nonfinite_skipped = int(state.get("nonfinite_skipped", 0))
        self.data_skipped = int(state.get("data_skipped", 0))
        self.last_val = state.get("last_val")
