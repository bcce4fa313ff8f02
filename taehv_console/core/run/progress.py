"""What the controller's verdict needs from this attempt's trainer events, and nothing more: each
rank's start, `stop` and first `error`, the step and the newest completed checkpoint, read from the
byte offsets where the attempt began (an earlier attempt's `stop` must never end this one).
Everything a front end shows (loss, PSNR, ETA, health) comes from core/watch's RunView.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from taehv_console.core.run.records import DamagedRecord, damaged_line, parse_event


class EventTail:
    """Complete new lines of one JSONL file, from a byte offset; a partial last line waits for
    the next read, and a file that does not exist yet is simply empty. Each line is checked
    (records.parse_event): a damaged one (torn by a crash, binary, a field of the wrong type) is
    skipped and named by file and line in `damaged`, and the lines after it are read on."""

    def __init__(self, path: Path, offset: int = 0, note: Callable[[str], None] | None = None):
        self.path = path
        self.offset = offset
        self.damaged: list[str] = []  # one line per damaged record, oldest first (bounded)
        self._note = note  # told each damaged line as it is skipped (the controller's notes)

    def read(self, limit_bytes: int = 8 << 20) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read(limit_bytes)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return []
        except OSError as err:
            self._damaged(None, f"unreadable ({err.strerror or err})")
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        start = self.offset
        self.offset += end + 1
        out = []
        pos = 0
        for line in data[: end + 1].split(b"\n")[:-1]:
            at = start + pos
            pos += len(line) + 1
            if not line.strip():
                continue
            try:
                out.append(parse_event(line))
            except DamagedRecord as err:
                self._damaged(at, str(err))
        return out

    def _damaged(self, at: int | None, why: str) -> None:
        if len(self.damaged) < MAX_DAMAGED:
            text = damaged_line(str(self.path), _line_number(self.path, at), why)
            self.damaged.append(text)
            if self._note is not None:
                self._note(text)


MAX_DAMAGED = 100  # damaged records named per file; the rest are skipped without a word


def _line_number(path: Path, at: int | None) -> int | None:
    """The 1-based line that starts at byte `at` (counted only for a damaged line: rare)."""
    if at is None:
        return None
    try:
        with open(path, "rb") as f:
            n, left = 1, at
            while left > 0:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:
                    break
                n += chunk.count(b"\n")
                left -= len(chunk)
        return n
    except OSError:
        return None


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
    """This attempt's events so far. Mutable, owned by one controller thread."""

    world_size: int
    max_steps: int
    step: int = 0
    checkpoint_step: int | None = None  # newest checkpoint this attempt completed
    started_ranks: set[int] = field(default_factory=set)
    stops: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its stop event
    errors: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> its first error event
    last_event_time: float | None = None
    first_step_time: float | None = None  # rank 0's first `step` of this attempt: training again
    last_step_time: float | None = None

    def add(self, event: dict[str, Any]) -> None:
        kind, rank = event.get("kind"), event.get("rank")
        t = event.get("time")  # checked where it was read (records.EventLine): a finite number or absent
        self.last_event_time = float(t) if t is not None else time.time()
        if kind == "start" and isinstance(rank, int):
            self.started_ranks.add(rank)
            self.step = max(self.step, int(event.get("step") or 0))
        elif kind == "step" and rank == 0:
            step = event.get("step")
            self.step = step if isinstance(step, int) else self.step
            self.last_step_time = self.last_event_time
            if self.first_step_time is None:
                self.first_step_time = self.last_event_time
        elif kind == "checkpoint" and rank == 0 and event.get("status") == "complete":
            self.checkpoint_step = event.get("step")
        elif kind == "error" and isinstance(rank, int):
            self.errors.setdefault(rank, event)
        elif kind == "stop" and isinstance(rank, int):
            self.stops[rank] = event

    def snapshot(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "max_steps": self.max_steps,
            "checkpoint_step": self.checkpoint_step,
            "ranks_started": len(self.started_ranks),
            "world_size": self.world_size,
            "ranks_stopped": len(self.stops),
        }


class AttemptEvents:
    """Tails every rank's events file from where the attempt began and feeds a RunProgress."""

    def __init__(
        self,
        events_dir: Path,
        world_size: int,
        max_steps: int,
        offsets: dict[int, int] | None = None,
        note: Callable[[str], None] | None = None,
    ):
        self.events_dir = events_dir
        self.progress = RunProgress(world_size=world_size, max_steps=max_steps)
        offsets = offsets or {}
        self._tails = {
            r: EventTail(events_dir / f"rank-{r}.jsonl", offsets.get(r, 0), note) for r in range(world_size)
        }

    def poll(self) -> list[dict[str, Any]]:
        """New events of every rank (rank order within one poll), already folded into progress."""
        new = []
        for tail in self._tails.values():
            for event in tail.read():
                self.progress.add(event)
                new.append(event)
        return new

    def damaged(self) -> list[str]:
        """The damaged lines skipped so far, each named by file and line (every rank's)."""
        return [line for tail in self._tails.values() for line in tail.damaged]
