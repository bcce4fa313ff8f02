"""Trainer events (`events/rank-<r>.jsonl`) and heartbeats (`heartbeat/rank-<r>.json`).

The contract is docs/design.md's: every event line carries v, time, rank, kind; readers ignore
unknown kinds and fields, so fields are only ever added, never renamed.
"""

from __future__ import annotations

import faulthandler
import json
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

EVENT_VERSION = 1
BEAT_EVERY_S = 1.0  # training steps' heartbeats: written at most this often
WAIT_TOLD_AFTER_S = 2.0  # a collective wait this long is told in the heartbeat (a normal one never is)
# A device runs at most about a step behind its host (one host read per step); a collective it has
# not got past for this many step times is waited in. Below the console's stall bound (2 steps).
DEVICE_BEHIND_STEPS = 1.5


def _finite(value: object) -> object:
    # JSON has no NaN/Infinity; a non-finite metric becomes null rather than an unparseable line.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# A rank dumps every thread's Python stack into stacks/rank-<r>.txt on this signal (faulthandler):
# the console's forensics asks for it where py-spy is missing or not permitted (a container without
# SYS_PTRACE). The header says which process installed the handler: the console signals only a
# process whose pid and start time match it, since the signal's default action ends a process.
STACK_SIGNAL = signal.SIGUSR2
STACK_HEADER = "# taehv stack dumps: pid={pid} start={start} main={main:#x}\n"


def stacks_path(run_dir: Path, rank: int) -> Path:
    return run_dir / "stacks" / f"rank-{rank}.txt"


def process_start(pid: int | str = "self") -> str:
    """A process's start time in clock ticks since boot (/proc/<pid>/stat field 22), which with the
    pid names one process for good; '' where /proc cannot say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split()[19]
    except (OSError, ValueError, IndexError):
        return ""


def install_stack_dump(run_dir: Path, rank: int) -> Path:
    """Write every thread's stack to `stacks_path` on STACK_SIGNAL, for this process's life.
    faulthandler's handler needs no ptrace and runs even while the main thread is blocked in C (a
    collective, a device read); the file is appended to, one header per process (a relaunched rank
    adds its own), then each dump in faulthandler's format."""
    path = stacks_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a", buffering=1)  # noqa: SIM115 - faulthandler writes to it for the process's life
    faulthandler.register(STACK_SIGNAL, file=f, all_threads=True, chain=False)
    main = threading.main_thread().ident or 0
    f.write(STACK_HEADER.format(pid=os.getpid(), start=process_start(), main=main))  # after: ready
    return path


def atomic_write_text(path: Path, text: str | bytes, fsync: bool = False) -> None:
    """Write via a temp file in the same directory and os.replace, so readers never see half a file
    (bytes as they are). A write that fails (a full disk) removes its temp file and raises."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, fields: dict[str, Any]) -> None:
    """`fields` as indented JSON, written as atomic_write_text writes."""
    atomic_write_text(path, json.dumps(fields, indent=1))


class EventWriter:
    """Appends one JSON object per line for one rank; each line is flushed as it is written."""

    def __init__(self, run_dir: Path, rank: int):
        self.rank = rank
        self.host = socket.gethostname()
        (run_dir / "events").mkdir(parents=True, exist_ok=True)
        (run_dir / "heartbeat").mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "events" / f"rank-{rank}.jsonl"
        self.heartbeat_path = run_dir / "heartbeat" / f"rank-{rank}.json"
        # line-buffered append: a crash loses at most the line being written, never earlier ones
        self._f = open(self.path, "a", buffering=1)  # noqa: SIM115 - open for the writer's life
        self._beat_lock = threading.Lock()  # the collective watch writes heartbeats from its thread
        self._last_beat: dict[str, Any] = {}
        self._pending = False  # _last_beat is newer than the file
        self._written_at = 0.0  # when the file was last written

    def emit(self, kind: str, **fields: object) -> dict:
        event = {"v": EVENT_VERSION, "time": time.time(), "rank": self.rank, "kind": kind}
        event.update({k: _finite(v) for k, v in fields.items()})
        self._f.write(json.dumps(event, separators=(",", ":")) + "\n")
        return event

    def heartbeat(self, step: int, *, now: bool = True, **extra: object) -> None:
        """This rank's heartbeat. With `now=False` (every training step) it is written at most once
        a second: a beat within a second of the last write is only recorded, and the collective
        watch's thread writes the newest one (a file write per step per rank is 1-5 ms on NFS, and
        hundreds of metadata operations a second at 64 ranks). Steps of a second or more write
        each beat as it comes, so their heartbeats age as they always did."""
        at = time.time()
        beat = {"step": step, "time": at, "pid": os.getpid(), "host": self.host}
        beat.update({k: _finite(v) for k, v in extra.items()})
        with self._beat_lock:
            self._last_beat = beat
            self._pending = not now and at - self._written_at < BEAT_EVERY_S
            if not self._pending:
                self._write(beat)

    def _write(self, beat: dict[str, Any]) -> None:
        atomic_write_text(self.heartbeat_path, json.dumps(beat))
        self._written_at = time.time()

    def flush_heartbeat(self) -> None:
        """Write the newest recorded heartbeat if it has not been written yet."""
        with self._beat_lock:
            if self._pending:
                self._pending = False
                self._write(self._last_beat)

    def newest_beat(self) -> tuple[float, float]:
        """When the newest step beat was recorded (written or not) and its `step_time_s` (0 without
        one); (0, 0) before the first."""
        with self._beat_lock:
            beat = self._last_beat
        step_time = beat.get("step_time_s")
        return float(beat.get("time", 0.0)), float(step_time) if isinstance(step_time, (int, float)) else 0.0

    def waiting_heartbeat(self, since: float, op: str) -> None:
        """The last heartbeat again, saying this rank has been blocked in a collective since
        `since`: the console tells the rank that holds the others up by its absence."""
        with self._beat_lock:
            if not self._last_beat:
                return
            beat = {**self._last_beat, "time": time.time(), "waiting_since": since, "waiting_op": op}
            self._pending = False
            self._write(beat)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def read_events(path: Path) -> list[dict]:
    """All complete event lines of one file (a partial last line is left for the next read)."""
    events = []
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


class DeviceMark(Protocol):
    """Where the device stands against the host's calls (CUDA: one event, `trainer.runtime.CudaMark`)."""

    def record(self) -> None:
        """Mark the current stream here: after this call's work is queued."""

    def done(self) -> bool:
        """Whether the device has passed the newest mark; never blocks."""


class CollectiveWatch:
    """Marks the time a rank spends blocked in a collective. A daemon thread rewrites the heartbeat
    once a wait has lasted `after_s` (a normal all-reduce never does), so the console can name the
    rank that is not waiting (stuck in data loading or compute, or stopped) while its peers are.
    The same thread writes the training steps' heartbeats (EventWriter.heartbeat(now=False)).
    Costs nothing per step: the hot path sets and clears one attribute.

    With a `device` (CUDA), a collective call only queues the collective, and the host blocks later
    at a read of a device value that is not marked. So each call that returns also marks the
    stream (`issued`), and the thread tells a wait in that collective when the device has not got
    past it for `after_s` and 1.5 step times with no step finished since: a device merely running
    behind its host catches up within a step; a collective whose peer never came does not."""

    def __init__(
        self, events: EventWriter, after_s: float = WAIT_TOLD_AFTER_S, device: DeviceMark | None = None
    ):
        self.events = events
        self.after_s = after_s
        self.device = device
        self._since: float | None = None
        self._depth = 0
        self._op = ""
        self._issued: tuple[str, float] | None = None  # the newest collective queued on the device
        self._told: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="taehv-collective-watch", daemon=True)
        self._thread.start()

    def enter(self, op: str) -> None:
        """Called by the training thread only; calls nest (a DeepSpeed collective inside one of the
        trainer's), and the outermost one is what the heartbeat tells."""
        self._depth += 1
        if self._depth == 1:
            self._op = op
            self._since = time.time()

    def leave(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._since = None

    @contextmanager
    def waiting(self, op: str) -> Iterator[None]:
        self.enter(op)
        try:
            yield
        finally:
            self.leave()

    def issued(self, op: str) -> None:
        """Called by the training thread after a collective call has returned (after an async
        handle's wait): with a device, the collective may only be queued, and the mark says when it
        is done. Without one the call itself was the wait."""
        if self.device is None:
            return
        self.device.record()
        self._issued = (op, time.time())

    def blocked(self, now: float | None = None) -> tuple[str, float] | None:
        """The collective this rank has waited in for `after_s` or more, and since when: the host
        blocked in the call, or (with a device) the device not past the newest collective."""
        now = time.time() if now is None else now
        since = self._since
        if since is not None:
            return (self._op, since) if now - since >= self.after_s else None
        issued, device = self._issued, self.device
        if issued is None or device is None:
            return None
        op, at = issued
        beat_at, step_time = self.events.newest_beat()
        if beat_at >= at or now - at < max(self.after_s, DEVICE_BEHIND_STEPS * step_time):
            return None  # a step finished after it, or the device may just be running behind
        try:
            done = device.done()
        except RuntimeError:  # a device in error (CUDA errors are RuntimeErrors): the rank's own error tells
            return None  # it; the thread must go on writing the step beats
        return None if done else (op, at)

    def _loop(self) -> None:
        while not self._stop.wait(min(1.0, self.after_s / 2)):
            try:
                wait = self.blocked()
                if wait is None or wait[1] == self._told:
                    self.events.flush_heartbeat()  # the training steps' beats, at most once a second
                    continue
                op, self._told = wait
                self.events.waiting_heartbeat(self._told, op)
            except OSError:
                pass  # the next heartbeat says the same; a failed write must not kill the thread

    def close(self) -> None:
        self._stop.set()
