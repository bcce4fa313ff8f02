"""Folds trainer events (`events/rank-<r>.jsonl`, docs/design.md's contract) into what a snapshot shows:
the latest step metrics, bounded histories, validation, checkpoint events, per-rank start/stop/error
and the last N notable events.

Catching up on a long run is the expensive case (a 100k-step run is 100k rank-0 lines), so step
lines are only parsed when they can still matter: histories keep the last `history_len` points and
the header uses the newest step, so older step lines of a batch are counted and skipped. Every
other kind is parsed in order. A test checks the result equals parsing every line, with one
designed difference: non-finite skips inside skipped lines come out as one notice carrying the
running count (the trainer's count is cumulative), instead of one notice per skip.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any

from taehv_console.core.run.records import DamagedRecord, damaged_line, parse_event
from taehv_console.core.watch.state import Notice

# The trainer writes compact JSON (separators without spaces); a writer that adds spaces misses
# this fast test and takes the full-parse path, which gives the same result.
_STEP_MARK = b'"kind":"step"'
RANK_FILE = re.compile(r"(?:^|/)rank-(\d+)\.jsonl$")
MAX_DAMAGED = 100  # damaged lines named; the rest are counted in bad_lines only


@dataclass
class RankEvents:
    """The latest attempt of one rank: a new `start` clears the previous attempt's stop/error."""

    start: dict | None = None
    stop: dict | None = None
    error: str | None = None
    last_time: float | None = None
    attempts: int = 0


class EventFold:
    def __init__(self, history_len: int = 600, notices_len: int = 100):
        self.history_len = history_len
        self.loss: deque[tuple[float, float]] = deque(maxlen=history_len)
        self.psnr: deque[tuple[float, float]] = deque(maxlen=history_len)
        self.lr: deque[tuple[float, float]] = deque(maxlen=history_len)
        self.clips: deque[tuple[float, float]] = deque(maxlen=history_len)
        self.val: deque[tuple[float, float]] = deque(maxlen=history_len)
        self.notices: deque[Notice] = deque(maxlen=notices_len)
        self._notice_keys: dict[Notice, None] = {}  # notices already given (insertion-ordered, bounded)
        self.last_step: dict | None = None  # newest rank-0 step event
        self.last_val: dict | None = None
        self.best_val_psnr: float | None = None
        self.ranks: dict[int, RankEvents] = {}
        self.checkpoints: dict[int, dict] = {}  # step -> newest checkpoint event for it
        self.data_skipped = 0
        self.first_start: float | None = None
        self.lines = 0
        self.bad_lines = 0
        self.damaged: list[str] = []  # damaged lines skipped, each named by file and line (bounded)
        self._damaged_seen: set[str] = set()
        self._line_no: dict[str, int] = {}  # file -> lines fed so far
        self.version = 0  # bumped on every change; the monitor rebuilds only what changed

    # ------------------------------------------------------------------ input
    def feed(self, rank: int, lines: list[bytes], path: str | None = None) -> None:
        """Complete lines of one rank's file, in file order (`path`: the file, relative to the run,
        whose lines they are, continuing where its last call ended). Each line parsed is checked
        (records.parse_event): a damaged one is skipped, counted in bad_lines and named by file
        and line in `damaged` and a warning notice, and the lines after it are read on."""
        if not lines:
            return
        path = path or f"events/rank-{rank}.jsonl"
        first = self._line_no.get(path, 0) + 1
        self._line_no[path] = first - 1 + len(lines)
        self.lines += len(lines)
        keep_steps = self.history_len if rank == 0 else 0
        n_steps = 0
        if keep_steps:
            n_steps = sum(1 for ln in lines if _STEP_MARK in ln)
        skip_before = n_steps - max(keep_steps, 1)  # always parse the newest step line of rank 0
        seen_steps = 0
        for i, line in enumerate(lines):
            if _STEP_MARK in line:
                if rank != 0:
                    continue  # per-rank step lines repeat rank 0's means; heartbeats carry the pulse
                seen_steps += 1
                if seen_steps <= skip_before:
                    continue  # would fall out of every bounded history before anyone saw it
            if not line.strip():
                continue
            try:
                ev = parse_event(line)
            except DamagedRecord as err:
                self.bad_lines += 1
                self._damaged(rank, damaged_line(path, first + i, str(err)))
                continue
            self.apply(rank, ev)
        self.version += 1

    def restart(self, path: str) -> None:
        """The file was replaced or truncated: its lines are counted from the first again."""
        self._line_no.pop(path, None)

    def _damaged(self, rank: int, text: str) -> None:
        if text in self._damaged_seen or len(self._damaged_seen) >= MAX_DAMAGED:
            return
        self._damaged_seen.add(text)
        self.damaged.append(text)
        last = self.ranks.get(rank)
        self._notice(last.last_time if last else None, "warning", text, rank)

    def apply(self, rank: int, ev: dict[str, Any]) -> None:
        kind = ev.get("kind")
        t = ev.get("time")
        r = ev.get("rank", rank)
        if not isinstance(r, int):
            r = rank
        re_ = self.ranks.get(r)
        if re_ is None:
            re_ = self.ranks[r] = RankEvents()
        if isinstance(t, (int, float)):
            re_.last_time = t
        if kind == "step":
            self._step(ev)
        elif kind == "start":
            re_.start, re_.stop, re_.error = ev, None, None
            re_.attempts += 1
            if self.first_start is None and isinstance(t, (int, float)):
                self.first_start = t
            if r == 0:
                if ev.get("resumed_from"):
                    self._notice(t, "info", f"resumed from {ev['resumed_from']} at step {ev.get('step')}", r)
                else:
                    self._notice(
                        t,
                        "info",
                        f"started: world size {ev.get('world_size')}, "
                        f"preset {ev.get('preset')}, {ev.get('max_steps')} steps",
                        r,
                    )
                for skipped in ev.get("skipped_checkpoints") or ():
                    self._notice(t, "warning", f"checkpoint not resumable: {skipped}", r)
        elif kind == "stop":
            re_.stop = ev
            reason = ev.get("reason")
            if r == 0 or reason == "error":
                sev = "error" if reason == "error" else "info"
                self._notice(t, sev, f"rank {r} stopped at step {ev.get('step')}: {reason}", r)
        elif kind == "error":
            re_.error = str(ev.get("message") or "error")
            self._notice(t, "error", f"rank {r}: {re_.error}", r)
        elif kind == "checkpoint":
            step = ev.get("step")
            if isinstance(step, int):
                self.checkpoints[step] = ev
            status = ev.get("status")
            if status == "complete":
                self._notice(t, "info", f"checkpoint step {step} complete ({ev.get('seconds')} s)", r)
            elif status == "failed":
                self._notice(t, "error", f"checkpoint step {step} FAILED: {ev.get('message', '')}", r)
        elif kind == "val":
            psnr = ev.get("psnr")
            if isinstance(psnr, (int, float)):
                self.last_val = ev
                self.val.append((float(ev.get("step") or 0), float(psnr)))
                if self.best_val_psnr is None or psnr > self.best_val_psnr:
                    self.best_val_psnr = float(psnr)
                self._notice(t, "info", f"validation at step {ev.get('step')}: PSNR {psnr:.2f} dB", r)
        elif kind == "compile" and r == 0:
            cache = ev.get("cache")
            if not isinstance(cache, dict):
                cache = {}
            secs = ev.get("first_step_s")
            took = f"{secs:.0f} s" if isinstance(secs, (int, float)) else "?"
            error = cache.get("error")
            self._notice(
                t,
                "warning" if error else "info",
                f"first step {took} with compilation: {cache.get('hits', 0)} graphs from cache, "
                f"{cache.get('misses', 0)} compiled" + (f" ({error})" if error else ""),
                r,
            )
        elif kind == "data":
            self.data_skipped += 1
            self._notice(t, "warning", f"rank {r} skipped {ev.get('path')}: {ev.get('reason')}", r)
        # unknown kinds: ignored (docs/design.md: readers ignore what they do not know)

    def _step(self, ev: dict[str, Any]) -> None:
        step = ev.get("step")
        if not isinstance(step, int):
            return
        prev = self.last_step
        self.last_step = ev
        x = float(step)
        for series, key in (
            (self.loss, "loss"),
            (self.psnr, "psnr"),
            (self.lr, "lr"),
            (self.clips, "samples_per_s"),
        ):
            v = ev.get(key)
            if isinstance(v, (int, float)):
                series.append((x, float(v)))
        skipped = ev.get("nonfinite_skipped")
        if prev is not None and isinstance(skipped, int) and skipped > (prev.get("nonfinite_skipped") or 0):
            self._notice(
                ev.get("time"),
                "warning",
                f"step {step}: non-finite loss, micro-batch skipped ({skipped} so far)",
                0,
            )

    def _notice(self, t: object, severity: str, text: str, rank: int | None) -> None:
        notice = Notice(
            time=float(t) if isinstance(t, (int, float)) else 0.0,
            severity=severity,
            source="events",
            text=text,
            rank=rank,
        )
        # One event is one notice, however often its line is read: a file read again from the
        # start (replaced, or truncated and rewritten) showed "rank 0 stopped ..." twice.
        if notice.time and notice in self._notice_keys:
            return
        self._notice_keys[notice] = None
        if len(self._notice_keys) > 4 * (self.notices.maxlen or 100):
            self._notice_keys.pop(next(iter(self._notice_keys)))
        self.notices.append(notice)

    # ------------------------------------------------------------------ views
    def checkpoint_in_flight(self) -> int | None:
        """A step whose save started and has neither completed nor failed (newest such)."""
        live = [s for s, ev in self.checkpoints.items() if ev.get("status") == "started"]
        return max(live) if live else None

    def last_checkpoint_seconds(self) -> float | None:
        done = [ev for ev in self.checkpoints.values() if ev.get("status") == "complete"]
        if not done:
            return None
        sec = max(done, key=lambda e: e.get("step") or 0).get("seconds")
        return float(sec) if isinstance(sec, (int, float)) else None


def rank_of(path: str) -> int | None:
    m = RANK_FILE.search(path)
    return int(m.group(1)) if m else None
