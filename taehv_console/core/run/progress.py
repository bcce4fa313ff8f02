"""Just enough of the trainer's events for control and a progress line: new lines of every rank's
events file read from a byte offset, folded into the current step, loss, PSNR, clips/s, ETA and
each rank's `stop`. The full watcher (health, stragglers, histories) is core/watch's job; this is
the minimum that stop, failure detection and the headless progress need.
"""

from __future__ import annotations

import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class EventTail:
    """Complete new lines of one JSONL file, from a byte offset; a partial last line waits for
    the next read, and a file that does not exist yet is simply empty."""

    def __init__(self, path: Path, offset: int = 0):
        self.path = path
        self.offset = offset

    def read(self, limit_bytes: int = 8 << 20) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(limit_bytes)
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        out = []
        for line in data[: end + 1].splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line torn by a crash: the writer's next line is whole again
            if isinstance(event, dict):
                out.append(event)
        return out


def file_sizes(events_dir: Path) -> dict[int, int]:
    """rank -> current size of its events file: where the next attempt's events start."""
    sizes = {}
    if events_dir.is_dir():
        for p in events_dir.glob("rank-*.jsonl"):
            try:
                sizes[int(p.stem.split("-", 1)[1])] = p.stat().st_size
            except (ValueError, OSError):
                continue
    return sizes


@dataclass
class RunProgress:
    """What the events of one attempt say so far. Mutable, owned by one controller thread;
    front ends get `snapshot()` copies."""

    world_size: int
    max_steps: int
    step: int = 0
    first_step: int | None = None  # the first step this attempt reported (a resume starts late)
    loss: float | None = None
    psnr: float | None = None
    samples_per_s: float | None = None
    lr: float | None = None
    val_psnr: float | None = None
    checkpoint_step: int | None = None  # newest checkpoint this attempt completed
    started_ranks: set[int] = field(default_factory=set)
    stops: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its stop event
    errors: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its first error event
    first_step_time: float | None = None
    last_event_time: float | None = None
    _step_times: deque = field(default_factory=lambda: deque(maxlen=20))

    def add(self, event: dict[str, Any]) -> None:
        kind, rank = event.get("kind"), event.get("rank")
        self.last_event_time = event.get("time", time.time())
        if kind == "start" and isinstance(rank, int):
            self.started_ranks.add(rank)
            self.step = max(self.step, int(event.get("step") or 0))
        elif kind == "step" and rank == 0:
            self.step = int(event.get("step", self.step))
            if self.first_step is None:
                self.first_step = self.step
                self.first_step_time = event.get("time")
            self.loss = event.get("loss")
            self.psnr = event.get("psnr")
            self.samples_per_s = event.get("samples_per_s")
            self.lr = event.get("lr")
            if event.get("step_time_s"):
                self._step_times.append(float(event["step_time_s"]))
        elif kind == "val" and rank == 0:
            self.val_psnr = event.get("psnr")
        elif kind == "checkpoint" and rank == 0 and event.get("status") == "complete":
            self.checkpoint_step = event.get("step")
        elif kind == "error" and isinstance(rank, int):
            self.errors.setdefault(rank, event)
        elif kind == "stop" and isinstance(rank, int):
            self.stops[rank] = event

    @property
    def eta_s(self) -> float | None:
        if not self._step_times or self.step >= self.max_steps:
            return None
        per_step = sorted(self._step_times)[len(self._step_times) // 2]  # median: one slow step is no trend
        return per_step * (self.max_steps - self.step)

    def all_stopped(self) -> bool:
        return len(self.stops) >= self.world_size

    def stop_reasons(self) -> set[str]:
        return {str(e.get("reason")) for e in self.stops.values()}

    def snapshot(self) -> dict[str, Any]:
        return {
            "step": self.step, "max_steps": self.max_steps, "loss": self.loss, "psnr": self.psnr,
            "samples_per_s": self.samples_per_s, "lr": self.lr, "val_psnr": self.val_psnr,
            "eta_s": self.eta_s, "checkpoint_step": self.checkpoint_step,
            "ranks_started": len(self.started_ranks), "world_size": self.world_size,
            "ranks_stopped": len(self.stops),
        }


class AttemptEvents:
    """Tails every rank's events file from where the attempt began and feeds a RunProgress."""

    def __init__(self, events_dir: Path, world_size: int, max_steps: int, offsets: dict[int, int] | None = None):
        self.events_dir = events_dir
        self.progress = RunProgress(world_size=world_size, max_steps=max_steps)
        offsets = offsets or {}
        self._tails = {r: EventTail(events_dir / f"rank-{r}.jsonl", offsets.get(r, 0)) for r in range(world_size)}

    def poll(self) -> list[dict[str, Any]]:
        """New events of every rank (rank order within one poll), already folded into progress."""
        new = []
        for tail in self._tails.values():
            for event in tail.read():
                self.progress.add(event)
                new.append(event)
        return new
