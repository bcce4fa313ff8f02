"""Pollers on a small thread pool: each source on each node polls on its own interval, with a
timeout and a backoff, and is rescheduled only after its previous poll ended (polls never pile up).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from taehv_console.core.watch.state import SourceStatus
from taehv_console.core.watch.tail import Tailer


@dataclass(frozen=True)
class PollerConfig:
    interval_s: float
    timeout_s: float
    backoff_max_s: float = 60.0


class Poller:
    """One source on one node. Subclasses implement poll(); it returns True when more is pending.
    `interval_s` may differ from the configured one when the source stretches it (a cost cap)."""

    def __init__(self, name: str, cfg: PollerConfig):
        self.name = name
        self.cfg = cfg
        self.interval_s = cfg.interval_s
        self.backoff = 0.0
        self.polls = 0
        self.last_ok: float | None = None
        self.error = ""
        self.last_duration: float | None = None
        self.started: float | None = None  # monotonic, while running
        # one poll at a time, also when a caller reads a source itself (Monitor.read_now) while the
        # scheduler runs: two tails from the same offset would hand the same lines over twice
        self._running = threading.Lock()

    def poll(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def problem(self) -> str:
        """A standing problem between polls (a poll that returns early is not a healthy source)."""
        return ""

    def status(self, now_mono: float) -> SourceStatus:
        running = None if self.started is None else now_mono - self.started
        err = self.error or self.problem()
        if running is not None and running > self.cfg.timeout_s:
            err = f"poll running for {running:.0f} s (timeout {self.cfg.timeout_s:g} s)"
        return SourceStatus(
            self.name,
            ok=not err,
            last_ok=self.last_ok,
            error=err,
            polls=self.polls,
            last_duration_s=self.last_duration,
            running_for_s=running,
        )

    def run_once(self) -> bool:
        """poll() with its bookkeeping (what the scheduler does around each poll); True: more pending.
        A call while another is polling this source waits for it to end."""
        with self._running:
            return self._run_once()

    def _run_once(self) -> bool:
        self.started = time.monotonic()
        try:
            more = bool(self.poll())
            self.error = ""
            self.backoff = 0.0
            self.last_ok = time.time()
            return more
        except Exception as err:  # a poll failure is reported on its source and retried
            self.error = f"{type(err).__name__}: {err}"[:400]
            self.backoff = min(max(self.backoff * 2, self.interval_s), self.cfg.backoff_max_s)
            raise
        finally:
            self.polls += 1
            self.last_duration = time.monotonic() - self.started
            self.started = None


class CallPoller(Poller):
    def __init__(self, name: str, cfg: PollerConfig, fn: Callable[[], bool]):
        super().__init__(name, cfg)
        self._fn = fn

    def poll(self) -> bool:
        return self._fn()


class FilesPoller(Poller):
    """A Tailer's new lines and replaced files, handed to `apply(result, now, reader)`."""

    def __init__(
        self,
        name: str,
        cfg: PollerConfig,
        tailer: Tailer,
        apply: Callable[[Any, float, str], None],
        reader: str,
        always: bool = False,
    ):
        super().__init__(name, cfg)
        self.tailer = tailer
        self._apply = apply
        self._reader = reader
        self._always = always

    def poll(self) -> bool:
        res = self.tailer.poll()
        if self._always or res.lines or res.whole or res.reset:
            self._apply(res, time.time(), self._reader)
        return res.more


class Scheduler:
    """Runs pollers on a small thread pool. A poller is never queued twice: its next run is
    scheduled when its current one returns (interval, or backoff after an error)."""

    def __init__(self, workers: int):
        self._heap: list[tuple[float, int, Poller]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="taehv-watch")
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="taehv-watch-scheduler", daemon=True)

    def add(self, poller: Poller, delay: float = 0.0) -> None:
        due = time.monotonic() + delay
        with self._cv:
            # Wake the loop only when this poll is due before the one it is already waiting for:
            # with 64 agents a second, a wake-up per completed poll is a measurable share of the cost.
            wake = not self._heap or due < self._heap[0][0]
            heapq.heappush(self._heap, (due, next(self._seq), poller))
            if wake:
                self._cv.notify()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _loop(self) -> None:
        while True:
            with self._cv:
                if self._stopped:
                    return
                now = time.monotonic()
                due = []
                while self._heap and self._heap[0][0] <= now:
                    due.append(heapq.heappop(self._heap)[2])
                if not due:
                    self._cv.wait(timeout=(self._heap[0][0] - now) if self._heap else 1.0)
                    continue
            for p in due:
                p.started = time.monotonic()
                try:
                    self._pool.submit(self._run, p)
                except RuntimeError:  # shutting down
                    return

    def _run(self, p: Poller) -> None:
        try:
            delay = 0.0 if p.run_once() else p.interval_s
        except Exception:  # noqa: BLE001 - recorded on the poller by run_once
            delay = p.backoff
        with self._cv:
            if self._stopped:
                return
        self.add(p, delay)
