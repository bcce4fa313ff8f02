"""The monitor: one poller per source and node (agents, events, heartbeats, logs, checkpoints,
TensorBoard), each with its own interval, timeout and backoff and rescheduled only after its
previous poll ended, folding what they read into immutable ClusterState snapshots for subscribers.

    mon = Monitor(run_dir, hosts=["gpu1", "gpu2"], pool=pool).start()
    unsubscribe = mon.subscribe(lambda state: ...)   # called from a monitor thread on change
    ...
    mon.stop()

    state = snapshot_once(run_dir)                   # one synchronous read (`status --json`)

Pollers do their I/O outside the lock and apply results under it; a publish job (itself a poller)
re-evaluates health on a tick, since "stalled" and "lost" arise from time passing, and builds a
snapshot only when something changed.
"""

from __future__ import annotations

import fcntl
import heapq
import itertools
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from taehv_console.core.watch.agent import parse_sample
from taehv_console.core.watch.checkpoints import CheckpointWatcher, RunActivity
from taehv_console.core.watch.events import EventFold, rank_of
from taehv_console.core.watch.health import (
    HealthPolicy,
    RankObservation,
    assess_node,
    assess_ranks,
    watchdog_counts,
)
from taehv_console.core.watch.logscan import LogScanner
from taehv_console.core.watch.state import (
    CheckpointSummary,
    ClusterState,
    Histories,
    LogSignal,
    NodeSample,
    NodeSnapshot,
    Notice,
    RankHealth,
    RankState,
    RunHeader,
    Series,
    SourceStatus,
)
from taehv_console.core.watch.tail import LocalFiles, RemoteFiles, Tailer

_NODE_LOG = re.compile(r"node-(\d+)\.log$")


@dataclass(frozen=True)
class PollerConfig:
    interval_s: float
    timeout_s: float
    backoff_max_s: float = 60.0


@dataclass(frozen=True)
class MonitorConfig:
    events: PollerConfig = PollerConfig(1.0, 30.0)
    heartbeats: PollerConfig = PollerConfig(1.0, 30.0)
    logs: PollerConfig = PollerConfig(2.0, 30.0)
    checkpoints: PollerConfig = PollerConfig(10.0, 120.0)
    agents: PollerConfig = PollerConfig(1.0, 15.0)  # how often each agent's output is drained
    tensorboard: PollerConfig = PollerConfig(5.0, 60.0)
    publish_interval_s: float = 0.5  # health tick; snapshots go out at most this often
    # ...and the tick stretches so that building snapshots costs at most this share of one core
    # (a 512-rank snapshot takes ~15 ms: at 2 per second that alone would be 3%)
    publish_cpu_share: float = 0.02
    agent_interval_s: float = 1.0
    agent_restart_s: float = 5.0  # first restart delay after an agent exits or goes silent (doubles)
    history_len: int = 600
    gpu_history_len: int = 120
    notices_len: int = 100
    signals_len: int = 200
    workers: int = 8
    local_read_bytes: int = 8 << 20
    remote_read_bytes: int = 2 << 20
    health: HealthPolicy = field(default_factory=HealthPolicy)


# ------------------------------------------------------------------------------- agent streams


class LineStream(Protocol):
    """A running agent's output. read_lines never blocks for long; exited is True after EOF."""

    exited: bool

    def read_lines(self) -> list[str]: ...
    def close(self) -> None: ...


class LocalLineStream:
    """An agent started here, its stdout read without blocking. Closing stdin ends it."""

    def __init__(self, argv: Sequence[str]):
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, bufsize=0, start_new_session=True)  # fmt: skip
        for f in (self.proc.stdout, self.proc.stderr):
            assert f is not None
            fl = fcntl.fcntl(f.fileno(), fcntl.F_GETFL)
            fcntl.fcntl(f.fileno(), fcntl.F_SETFL, fl | os.O_NONBLOCK)
        self._buf = b""
        self.stderr_tail = b""
        self.exited = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read_lines(self) -> list[str]:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        while True:
            try:
                data = os.read(self.proc.stdout.fileno(), 1 << 16)
            except BlockingIOError:
                break
            except OSError:
                data = b""
            if not data:
                self.exited = True
                break
            self._buf += data
        try:
            err = os.read(self.proc.stderr.fileno(), 1 << 16)
            self.stderr_tail = (self.stderr_tail + err)[-2000:]
        except (BlockingIOError, OSError):
            pass
        if b"\n" not in self._buf:
            return []
        head, _, self._buf = self._buf.rpartition(b"\n")
        return head.decode(errors="replace").split("\n")

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()  # the agent's cue to exit
            self.proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            self.proc.kill()  # the process we started, by its own pid
            self.proc.wait()
        except OSError:
            pass
        for f in (self.proc.stdout, self.proc.stderr):
            if f:
                f.close()


class RemoteLineStream:
    """An agent on a node over SSH (runner.open). A dead channel reads as silence; the monitor
    restarts an agent that stays silent past the agent timeout."""

    def __init__(self, runner: Any, argv: Sequence[str]):
        self._stream = runner.open(list(argv))
        self.exited = False

    def read_lines(self) -> list[str]:
        out = []
        for _ in range(1000):
            line = self._stream.readline(0.002)
            if line is None:
                break
            out.append(line)
        return out

    def close(self) -> None:
        self._stream.close()


def agent_argv(python: str, run_dir: str, interval: float) -> list[str]:
    return [python, "-m", "taehv_console.core.watch.agent", "--interval", f"{interval:g}", "--run", run_dir]


# ------------------------------------------------------------------------------------ scheduling


class _Poller:
    """One source on one node. Subclasses implement poll(); it returns True when more is pending."""

    def __init__(self, name: str, cfg: PollerConfig):
        self.name = name
        self.cfg = cfg
        self.backoff = 0.0
        self.polls = 0
        self.last_ok: float | None = None
        self.error = ""
        self.last_duration: float | None = None
        self.started: float | None = None  # monotonic, while running
        self.timed_out = False

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
        return SourceStatus(self.name, ok=not err, last_ok=self.last_ok, error=err, polls=self.polls,
                            last_duration_s=self.last_duration, running_for_s=running)  # fmt: skip


class _Scheduler:
    """Runs pollers on a small thread pool. A poller is never queued twice: its next run is
    scheduled when its current one returns (interval, or backoff after an error)."""

    def __init__(self, workers: int):
        self._heap: list[tuple[float, int, _Poller]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="taehv-watch")
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="taehv-watch-scheduler", daemon=True)

    def add(self, poller: _Poller, delay: float = 0.0) -> None:
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

    def _run(self, p: _Poller) -> None:
        more = False
        try:
            more = bool(p.poll())
            p.error = ""
            p.backoff = 0.0
            p.last_ok = time.time()
            delay = 0.0 if more else p.cfg.interval_s
        except Exception as err:  # noqa: BLE001 - a poll failure is reported on its source and retried
            p.error = f"{type(err).__name__}: {err}"[:400]
            p.backoff = min(max(p.backoff * 2, p.cfg.interval_s), p.cfg.backoff_max_s)
            delay = p.backoff
        finally:
            p.polls += 1
            p.last_duration = time.monotonic() - (p.started or time.monotonic())
            p.started = None
        with self._cv:
            if self._stopped:
                return
        self.add(p, delay)


# ----------------------------------------------------------------------------- per-rank tracking


class _RankTracker:
    def __init__(self, rank: int, window: int):
        self.rank = rank
        self.pid: int | None = None
        self.host: str | None = None
        self.step: int | None = None
        self.hb_time: float | None = None
        self.progress_time: float | None = None
        self.stopped = False
        self.step_times: deque[float] = deque(maxlen=window)
        self.busy: deque[float] = deque(maxlen=window)
        self.data_wait: deque[float] = deque(maxlen=window)  # share of each step spent waiting for data

    def update(self, hb: Mapping[str, Any], offset: float, now: float) -> bool:
        step, t, pid = hb.get("step"), hb.get("time"), hb.get("pid")
        if not isinstance(step, int) or not isinstance(t, (int, float)):
            return False
        pid = pid if isinstance(pid, int) else None
        if t == self.hb_time and pid == self.pid:
            return False
        new_attempt = pid != self.pid
        if new_attempt:  # a relaunch: its steps are not a continuation of the old process's
            self.step_times.clear()
            self.busy.clear()
            self.data_wait.clear()
        advanced = new_attempt or self.step is None or step != self.step
        st = hb.get("step_time_s")
        if advanced and isinstance(st, (int, float)) and st > 0:
            wait = hb.get("wait_s")
            self.step_times.append(float(st))
            self.busy.append(max(0.0, float(st) - float(wait)) if isinstance(wait, (int, float)) else float(st))
            data_wait = hb.get("data_wait_s")  # absent from trainers before it existed
            if isinstance(data_wait, (int, float)):
                self.data_wait.append(min(1.0, max(0.0, float(data_wait) / float(st))))
        if advanced:
            # The node's clock, corrected by its agent's offset, never later than now.
            self.progress_time = min(float(t) - offset, now)
        self.pid = pid
        if isinstance(hb.get("host"), str):
            self.host = hb["host"]
        self.step, self.hb_time = step, float(t)
        self.stopped = bool(hb.get("stopped"))
        return True


class _AgentState:
    def __init__(self, node: str, gpu_history_len: int, restart_s: float):
        self.node = node
        self.stream: LineStream | None = None
        self.sample: NodeSample | None = None
        self.opened_at: float | None = None  # console clock
        self.first_open: float | None = None
        self.last_line: float | None = None
        self.restart_at = 0.0
        self.restart_s = restart_s
        self.backoff = restart_s
        self.status = "starting"
        self.offsets: deque[float] = deque(maxlen=10)
        self.gpu_hist: dict[int, deque[tuple[float, float]]] = {}
        self.gpu_series: dict[int, Series] = {}  # cached snapshot form, dropped when a point arrives
        self.gpu_history_len = gpu_history_len
        self.bad_lines = 0
        self.lock = threading.Lock()

    @property
    def offset(self) -> float:
        # sample.time - receipt time: transport delay only makes it smaller, so the largest is best
        return max(self.offsets) if self.offsets else 0.0


# ------------------------------------------------------------------------------------ the monitor


class Monitor:
    """Watches one run directory.

    hosts: the nodes as the console reaches them (hostfile names); None = this machine only, with
        ranks that heartbeat from other machines shown as agent-less nodes named by their host.
    pool: an SshPool for remote hosts (one is made from the environment when needed).
    agents: run the node agent on every host (locally, or over SSH) for GPU/CPU/process samples.
    remote_files: read events/heartbeats/logs through each node's runner instead of from run_dir
        here (a run directory the console's machine does not see).
    tensorboard: also read scalars from this logdir (a run started by another tool).
    rank_nodes: rank -> host, when the placement is known (otherwise: heartbeat host, then node
        by node in host order, as torchrun numbers ranks).
    facts: host -> NodeFacts from the probe, carried into NodeSnapshot.facts.
    config: intervals, timeouts, history sizes and the HealthPolicy.
    agent_stream: host -> LineStream, to replace how agents are started (benchmarks, demos).
    """

    def __init__(self, run_dir: str | Path, *, hosts: Sequence[str] | None = None, pool: Any = None,
                 agents: bool = True, remote_files: bool = False, tensorboard: str | Path | None = None,
                 rank_nodes: Mapping[int, str] | None = None, facts: Mapping[str, Any] | None = None,
                 config: MonitorConfig | None = None,
                 agent_stream: Callable[[str], LineStream] | None = None):  # fmt: skip
        self.run_dir = Path(run_dir)
        self.cfg = config or MonitorConfig()
        self.local_mode = hosts is None
        self.hosts = list(hosts) if hosts is not None else [socket.gethostname()]
        self._pool = pool
        self._own_pool = False
        self.rank_nodes = dict(rank_nodes or {})
        self.facts = dict(facts or {})
        self.agents_on = agents
        self._agent_stream = agent_stream
        self._lock = threading.RLock()
        self._subs: list[Callable[[ClusterState], None]] = []
        self._fold = EventFold(self.cfg.history_len, self.cfg.notices_len)
        self._scanner = LogScanner()
        self._signals: deque[LogSignal] = deque(maxlen=self.cfg.signals_len)
        self._notices: deque[Notice] = deque(maxlen=self.cfg.notices_len)
        self._ranks: dict[int, _RankTracker] = {}
        self._agents = {h: _AgentState(h, self.cfg.gpu_history_len, self.cfg.agent_restart_s) for h in self.hosts}
        self._checkpoints = CheckpointSummary()
        self._ckpt = CheckpointWatcher(self.run_dir / "checkpoints")
        self._run_cfg: dict[str, Any] = {}
        self._owner: dict[str, str] = {}  # file -> the reader (node) whose lines of it count
        self._console_state: dict[str, Any] = {}
        self._tb = None
        if tensorboard is not None:
            from taehv_console.core.watch.tbscalars import TensorBoardScalars

            self._tb = TensorBoardScalars(tensorboard, self.cfg.history_len)
        self._version = 0
        self._published_key: Any = None
        self._latest: ClusterState | None = None
        self._seq = 0
        self._prev_states: dict[str, str] = {}
        self._started = False
        self._sched: _Scheduler | None = None
        self._publisher: _Poller | None = None
        self._pollers: list[_Poller] = self._make_pollers()
        if remote_files:
            self._use_remote_files()

    # ------------------------------------------------------------------ lifecycle
    def _make_pollers(self) -> list[_Poller]:
        c = self.cfg
        ps: list[_Poller] = []
        if self.agents_on:
            ps += [_AgentPoller(self, h) for h in self.hosts]
        ps += self._file_pollers("", LocalFiles(), c.local_read_bytes)
        ps.append(_CallPoller("checkpoints", c.checkpoints, self._poll_checkpoints))
        if self._tb is not None:
            ps.append(_CallPoller("tensorboard", c.tensorboard, self._poll_tensorboard))
        return ps

    def _file_pollers(self, suffix: str, src: Any, nbytes: int) -> list[_Poller]:
        c, d = self.cfg, self.run_dir
        return [
            _FilesPoller(f"events{suffix}", c.events, Tailer(d, src, append=["events/rank-*.jsonl"],
                         whole=["state.json", "run.toml"], max_bytes=nbytes), self._apply_events, suffix),
            _FilesPoller(f"heartbeats{suffix}", c.heartbeats, Tailer(d, src, whole=["heartbeat/rank-*.json"],
                         max_bytes=nbytes), self._apply_heartbeats, suffix),
            # always applied: a root-cause block at the end of a quiet log is flushed
            _FilesPoller(f"logs{suffix}", c.logs, Tailer(d, src, append=["logs/*.log"], max_bytes=nbytes),
                         self._apply_logs, suffix, always=True),
        ]  # fmt: skip

    def _use_remote_files(self) -> None:
        """Events, heartbeats and logs through each node's runner: a run directory this machine
        does not see (each node's own copy holds its own ranks' files)."""
        self._pollers = [p for p in self._pollers if not isinstance(p, _FilesPoller)]
        for h in self.hosts:
            self._pollers += self._file_pollers(f"@{h}", _LazyRemoteFiles(self, h), self.cfg.remote_read_bytes)

    def start(self) -> Monitor:
        if self._started:
            return self
        self._started = True
        self._sched = _Scheduler(self.cfg.workers)
        for i, p in enumerate(self._pollers):
            self._sched.add(p, delay=0.001 * i)  # a small stagger: 64 agents do not wake as one
        self._publisher = _CallPoller("publish", PollerConfig(self.cfg.publish_interval_s, 30.0), self._publish)
        self._sched.add(self._publisher, delay=self.cfg.publish_interval_s)
        self._sched.start()
        return self

    def stop(self) -> None:
        if self._sched is not None:
            self._sched.stop()
            self._sched = None
        for a in self._agents.values():
            with a.lock:
                if a.stream is not None:
                    a.stream.close()
                    a.stream = None
        if self._own_pool and self._pool is not None:
            self._pool.close()
        self._started = False

    def __enter__(self) -> Monitor:  # noqa: PYI034 - Python 3.10 has no typing.Self
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def subscribe(self, callback: Callable[[ClusterState], None]) -> Callable[[], None]:
        """callback(state) on every changed snapshot, from a monitor thread (a UI posts a message
        from it). Returns a function that unsubscribes."""
        with self._lock:
            self._subs.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subs:
                    self._subs.remove(callback)

        return unsubscribe

    def snapshot(self) -> ClusterState:
        """The newest published snapshot (built now if none has been)."""
        latest = self._latest
        if latest is None:
            with self._lock:
                latest = self._latest = self._build(time.time())
        return latest

    def poll_once(self) -> ClusterState:
        """Every poller once, here and now (draining backlogs), then a snapshot. For one-shot use;
        not while started."""
        for p in self._pollers:
            for _ in range(10_000):
                try:
                    if not p.poll():
                        break
                except Exception as err:  # noqa: BLE001 - reported on the source, as the scheduler would
                    p.error = f"{type(err).__name__}: {err}"[:400]
                    break
                p.polls += 1
                p.last_ok = time.time()
        with self._lock:
            self._latest = self._build(time.time())
        return self._latest

    # ------------------------------------------------------------------ runners
    def pool(self) -> Any:
        if self._pool is None:
            from taehv_console.core.cluster.ssh import SshPool

            self._pool = SshPool()
            self._own_pool = True
        return self._pool

    def _is_local(self, host: str) -> bool:
        from taehv_console.core.cluster.hosts import is_local_host

        return self.local_mode or is_local_host(host)

    def _open_agent(self, host: str) -> LineStream:
        if self._agent_stream is not None:
            return self._agent_stream(host)
        if self._is_local(host):
            return LocalLineStream(agent_argv(sys.executable, str(self.run_dir), self.cfg.agent_interval_s))
        runner = self.pool().runner(host)
        return RemoteLineStream(runner, agent_argv(runner.python, str(self.run_dir), self.cfg.agent_interval_s))

    # ------------------------------------------------------------------ applying what pollers read
    def _apply_agent_lines(self, a: _AgentState, lines: list[str], now: float) -> None:
        samples = []
        for line in lines:
            if not line.startswith("{"):
                continue
            try:
                samples.append(parse_sample(line, received=now))
            except (ValueError, KeyError, TypeError):
                a.bad_lines += 1
        if not samples:
            return
        with self._lock:
            for s in samples:
                a.offsets.append(s.time - now)
                t = s.time - a.offset  # on the console's clock, like every other time in a snapshot
                for g in s.gpus:
                    if g.util_pct is not None:
                        h = a.gpu_hist.get(g.index)
                        if h is None:
                            h = a.gpu_hist[g.index] = deque(maxlen=a.gpu_history_len)
                        h.append((t, g.util_pct))
                        a.gpu_series.pop(g.index, None)
            a.sample = samples[-1]
            a.last_line = now
            a.status = "running"
            a.backoff = a.restart_s
            self._version += 1

    def _mine(self, path: str, reader: str) -> bool:
        """Whether lines of `path` read through `reader` count. With remote files on shared storage
        every node sees every file: the first node to deliver a file owns it, so nothing is counted
        twice; on per-node storage the paths are disjoint and each node owns its own."""
        return self._owner.setdefault(path, reader) == reader

    def _apply_events(self, res: Any, now: float, reader: str = "") -> None:
        with self._lock:
            for path, data in res.whole.items():
                try:
                    if path == "run.toml":
                        self._run_cfg = _run_config(data.decode())
                    elif path == "state.json":
                        self._console_state = json.loads(data)
                except (ValueError, UnicodeDecodeError):
                    pass  # being rewritten; the next change reads it again
            for path, lines in res.lines.items():
                r = rank_of(path)
                if r is not None and self._mine(path, reader):
                    self._fold.feed(r, lines)
            self._version += 1

    def _apply_heartbeats(self, res: Any, now: float, reader: str = "") -> None:
        with self._lock:
            place = self._placement()
            for path, data in res.whole.items():
                m = re.search(r"rank-(\d+)\.json$", path)
                if not m:
                    continue
                try:
                    hb = json.loads(data)
                except ValueError:
                    continue
                r = int(m.group(1))
                t = self._ranks.get(r)
                if t is None:
                    t = self._ranks[r] = _RankTracker(r, max(self.cfg.health.straggler_window * 2, 16))
                a = self._agents.get(place(r, hb["host"] if isinstance(hb.get("host"), str) else None))
                offset = a.offset if a is not None else 0.0
                if t.update(hb, offset, now):
                    self._version += 1

    def _apply_logs(self, res: Any, now: float, reader: str = "") -> None:
        found: list[LogSignal] = []
        with self._lock:
            for path in res.reset:
                if self._mine(path, reader):
                    self._scanner.reset(path)
            for path, lines in res.lines.items():
                if self._mine(path, reader):
                    found += self._scanner.feed(path, [ln.decode(errors="replace") for ln in lines], now)
            for path in self._log_paths_quiet(res):
                if self._mine(path, reader):
                    found += self._scanner.flush(path, now)
            pid_rank = {t.pid: r for r, t in self._ranks.items() if t.pid is not None}
            for s in found:
                if s.rank is None and s.get("pid") in pid_rank:
                    s = replace(s, rank=pid_rank[s.get("pid")])
                self._signals.append(s)
                if s.severity in ("error", "warning"):
                    self._notices.append(Notice(now, s.severity, "log", f"{Path(s.source).name}:{s.line}: {s.text}"[:300],
                                                s.rank, self._node_of_log(s.source)))  # fmt: skip
            if found:
                self._version += 1

    def _log_paths_quiet(self, res: Any) -> list[str]:
        return [p for p in self._scanner.pending() if p not in res.lines]

    def _poll_checkpoints(self) -> bool:
        with self._lock:
            # fresh rank states: a one-shot read has built no snapshot yet
            ranks, _ = assess_ranks(self._observations(time.time()), self.cfg.health, time.time())
            live = any(h.state not in (RankState.STOPPED, RankState.FAILED) for h in ranks)
            fold = self._fold
            step = self._current_step()
            activity = RunActivity(live=live, step=step, max_steps=self._max_steps(),
                                   every=_get(self._run_cfg, "schedule", "checkpoint_every"),
                                   events=dict(fold.checkpoints) if fold.ranks else None)  # fmt: skip
        summary = self._ckpt.summary(activity)
        with self._lock:
            if summary != self._checkpoints:
                self._checkpoints = summary
                self._version += 1
        return False

    def _poll_tensorboard(self) -> bool:
        assert self._tb is not None
        points = self._tb.poll()
        if points:
            with self._lock:
                self._version += 1
        return False

    # ------------------------------------------------------------------ nodes and ranks
    def _world_size(self) -> int | None:
        sizes = [e.start.get("world_size") for e in self._fold.ranks.values() if e.start]
        sizes = [s for s in sizes if isinstance(s, int)]
        if sizes:
            return max(sizes)
        topo = self._run_cfg.get("topology") or {}
        if isinstance(topo.get("nodes"), int) and isinstance(topo.get("gpus_per_node"), int):
            return topo["nodes"] * topo["gpus_per_node"]
        return None

    def _placement(self) -> Callable[[int, str | None], str]:
        """rank, heartbeat host -> node. Explicit rank_nodes first; then the one node whose name or
        agent-reported host name is the heartbeat's host; with several candidates (loopback "nodes"
        of one machine) ranks are placed node by node, as torchrun numbers them. Built once per
        snapshot: 512 ranks x 64 nodes compared one by one was most of a snapshot's cost."""
        by_host: dict[str, list[str]] = {}
        for n in self.hosts:
            names = {n}
            sample = self._agents[n].sample
            if sample is not None:
                names.add(sample.host)
            for name in names:
                by_host.setdefault(name, []).append(n)
        hosts, single = self.hosts, len(self.hosts) == 1
        world = None if single else self._world_size()
        per = max(1, math.ceil(world / len(hosts))) if world else 0

        def place(rank: int, host: str | None) -> str:
            if rank in self.rank_nodes:
                return self.rank_nodes[rank]
            matches = by_host.get(host, ()) if host else ()
            if len(matches) == 1:
                return matches[0]
            if single:
                if not self.local_mode or not host or host == hosts[0]:
                    return hosts[0]
                return host  # local mode, a rank on another machine: a node without an agent
            if per:
                return hosts[min(rank // per, len(hosts) - 1)]
            return host or hosts[0]

        return place

    def _node_of_log(self, path: str) -> str | None:
        m = _NODE_LOG.search(path)
        if m and int(m.group(1)) < len(self.hosts):
            return self.hosts[int(m.group(1))]
        return None

    def _max_steps(self) -> int | None:
        for e in (self._fold.ranks.get(0), *self._fold.ranks.values()):
            if e is not None and e.start and isinstance(e.start.get("max_steps"), int):
                return e.start["max_steps"]
        return _get(self._run_cfg, "optim", "max_steps")

    def _current_step(self) -> int | None:
        steps = [t.step for t in self._ranks.values() if t.step is not None]
        last = self._fold.last_step.get("step") if self._fold.last_step else None
        cands = [s for s in [*steps, last] if isinstance(s, int)]
        return max(cands) if cands else None

    def _pause_rule(self) -> Callable[[int | None], float]:
        """step -> extra seconds a heartbeat may pause at it: validation and checkpoint steps, the
        last step (final validation, save, export), any step while a save is in flight."""
        sched = self._run_cfg.get("schedule") or {}
        every = [e for e in (sched.get("val_every"), sched.get("checkpoint_every")) if isinstance(e, int) and e > 0]
        last_step = self._max_steps()
        in_flight = self._fold.checkpoint_in_flight() is not None
        grace = max(self.cfg.health.pause_grace_s, 2 * (self._fold.last_checkpoint_seconds() or 0.0))

        def allowance(step: int | None) -> float:
            if step is None:
                return 0.0
            if in_flight or step == last_step or any(step % e == 0 for e in every):
                return grace
            return 0.0

        return allowance

    # ------------------------------------------------------------------ snapshots
    def _observations(self, now: float) -> list[RankObservation]:
        pid_signals: dict[int, list[LogSignal]] = {}
        rank_signals: dict[int, list[LogSignal]] = {}
        for s in self._signals:
            if s.severity != "error":
                continue
            if s.rank is not None:
                rank_signals.setdefault(s.rank, []).append(s)
            if s.get("pid") is not None:
                pid_signals.setdefault(int(s.get("pid")), []).append(s)
        obs = []
        pause = self._pause_rule()
        place = self._placement()
        ranks = set(self._ranks) | set(self._fold.ranks)
        for r in sorted(ranks):
            t = self._ranks.get(r)
            ev = self._fold.ranks.get(r)
            node = place(r, t.host if t else (ev.start.get("node") if ev and ev.start else None))
            a = self._agents.get(node)
            proc = None
            ptime = None
            if a is not None and a.sample is not None and t is not None and t.pid is not None:
                proc = a.sample.process(t.pid)
                ptime = a.sample.received
            finished = None
            if ev is not None and ev.stop is not None:
                finished = str(ev.stop.get("reason") or "done")
            elif t is not None and t.stopped:
                finished = "done"
            sigs = rank_signals.get(r, [])
            if t is not None and t.pid is not None:
                sigs = sigs + [s for s in pid_signals.get(t.pid, []) if s not in sigs]
            obs.append(RankObservation(
                rank=r, node=node, step=t.step if t else None, progress_time=t.progress_time if t else None,
                step_times=tuple(t.step_times) if t else (), busy=tuple(t.busy) if t else (),
                data_wait=tuple(t.data_wait) if t else (),
                pid=t.pid if t else None, finished=finished, error=ev.error if ev else None, process=proc,
                process_time=ptime, pause_allowance_s=pause(t.step if t else None),
                signals=tuple(sigs)))  # fmt: skip
        return obs

    def _build(self, now: float) -> ClusterState:
        pol = self.cfg.health
        obs = self._observations(now)
        timeout = _get(self._run_cfg, "distributed", "collective_timeout_s")
        ranks, collective = assess_ranks(obs, pol, now, watchdog=watchdog_counts(self._signals),
                                         collective_timeout_s=float(timeout) if timeout else None)  # fmt: skip
        node_names = list(self.hosts) + sorted({r.node for r in ranks} - set(self.hosts))
        by_node: dict[str, list[RankHealth]] = {}
        for r in ranks:
            by_node.setdefault(r.node, []).append(r)
        nodes = []
        for name in node_names:
            a = self._agents.get(name)
            node_ranks = by_node.get(name, [])
            sample = a.sample if a else None
            sample_age = (now - sample.received) if sample else None
            running_for = (now - a.first_open) if (a and a.first_open is not None) else None
            down = a.status if (a and a.stream is None and a.status.startswith(("restarting", "no sample"))) else ""
            state, detail = assess_node(name, node_ranks, sample, sample_age, pol,
                                        agent_expected=self.agents_on and a is not None,
                                        agent_running_for_s=running_for, agent_down=down)  # fmt: skip
            nodes.append(NodeSnapshot(name=name, state=state, detail=detail, sample=sample,
                                      sample_age_s=round(sample_age, 2) if sample_age is not None else None,
                                      ranks=tuple(r.rank for r in node_ranks),
                                      clock_offset_s=round(a.offset, 4) if (a and a.offsets) else None,
                                      agent=(a.status if a else "off") if self.agents_on else "off",
                                      facts=self.facts.get(name)))  # fmt: skip
        self._note_transitions(ranks, nodes, collective, now)
        header = self._header(ranks, collective, now)
        hist = self._histories()
        notices = sorted([*self._fold.notices, *self._notices], key=lambda n: n.time)[-self.cfg.notices_len :]
        self._seq += 1
        return ClusterState(
            time=now, seq=self._seq, run=header, nodes=tuple(nodes), ranks=ranks, collective=collective,
            checkpoints=self._checkpoints, history=hist, notices=tuple(notices), signals=tuple(self._signals),
            scalars=self._tb.series() if self._tb else (),
            sources=tuple(p.status(time.monotonic()) for p in self._pollers),
        )  # fmt: skip

    def _header(self, ranks: tuple[RankHealth, ...], collective: Any, now: float) -> RunHeader:
        fold = self._fold
        last = fold.last_step or {}
        step = self._current_step()
        max_steps = self._max_steps()
        times = [t for tr in self._ranks.values() for t in tr.step_times]
        step_time = statistics.median(times) if times else last.get("step_time_s")
        eta = (max_steps - step) * step_time if (max_steps and step is not None and step_time) else None
        start0 = (fold.ranks.get(0).start if fold.ranks.get(0) else None) or {}
        states = [r.state for r in ranks]
        stops = [e.stop.get("reason") for e in fold.ranks.values() if e.stop]
        if not ranks and not fold.ranks:
            phase = "waiting"
        elif states and all(s in (RankState.STOPPED, RankState.FAILED) for s in states):
            if RankState.FAILED in states or "error" in stops:
                phase = "failed"
            else:
                phase = "done" if all(s == "done" for s in stops) and stops else "stopped"
        elif RankState.FAILED in states:
            phase = "failed"
        elif collective is not None or RankState.STALLED in states:
            phase = "stalled"
        elif any(tr.step_times for tr in self._ranks.values()) or last:
            phase = "running"
        else:
            phase = "starting"
        updated = max([t for t in [*(tr.hb_time for tr in self._ranks.values()),
                                   *(e.last_time for e in fold.ranks.values())] if t is not None], default=None)  # fmt: skip
        cs = self._console_state.get("phase") if isinstance(self._console_state, dict) else None
        return RunHeader(
            run_dir=str(self.run_dir), run_id=self.run_dir.name, phase=phase, console_phase=cs, step=step,
            max_steps=max_steps, world_size=self._world_size(), preset=start0.get("preset") or _get(self._run_cfg, "run", "preset"),
            loss=last.get("loss"), psnr=last.get("psnr"), lr=last.get("lr"), clips_per_s=last.get("samples_per_s"),
            step_time_s=step_time, eta_s=eta if phase in ("running", "stalled", "starting") else None,
            val_step=(fold.last_val or {}).get("step"), val_psnr=(fold.last_val or {}).get("psnr"),
            best_val_psnr=fold.best_val_psnr, started=fold.first_start, updated=updated,
            stop_reason=(fold.ranks.get(0).stop or {}).get("reason") if fold.ranks.get(0) else None,
            data_skipped=fold.data_skipped, nonfinite_skipped=int(last.get("nonfinite_skipped") or 0),
        )  # fmt: skip

    def _histories(self) -> Histories:
        fold = self._fold
        gpu = []
        for name, a in self._agents.items():
            for idx in sorted(a.gpu_hist):
                series = a.gpu_series.get(idx)
                if series is None:
                    series = a.gpu_series[idx] = Series(f"{name}/{idx}", tuple(a.gpu_hist[idx]))
                gpu.append(series)
        if fold.loss or self._tb is None:
            return Histories(loss=Series("loss", tuple(fold.loss)), psnr=Series("psnr", tuple(fold.psnr)),
                             lr=Series("lr", tuple(fold.lr)), val_psnr=Series("val_psnr", tuple(fold.val)),
                             clips_per_s=Series("clips_per_s", tuple(fold.clips)), gpu_util=tuple(gpu))  # fmt: skip
        from taehv_console.core.watch.tbscalars import HISTORY_TAGS

        by_tag = {s.name: s for s in self._tb.series()}
        kw = {field_: Series(field_, by_tag[tag].points) for tag, field_ in HISTORY_TAGS.items() if tag in by_tag}
        return Histories(**kw, gpu_util=tuple(gpu))

    def _note_transitions(self, ranks: tuple[RankHealth, ...], nodes: list[NodeSnapshot], collective: Any,
                          now: float) -> None:  # fmt: skip
        quiet = {"healthy", "starting", "ok", "unknown", "stopped"}
        current = {f"rank {r.rank}": r.state.value for r in ranks}
        current.update({f"node {n.name}": n.state.value for n in nodes})
        current["collective"] = "stalled" if collective is not None else "ok"
        for key, state in current.items():
            prev = self._prev_states.get(key)
            if prev is None or prev == state or (prev in quiet and state in quiet):
                continue
            if key == "collective":
                text = (f"collective stalled: waiting for rank {collective.laggard_rank} on {collective.laggard_node} "
                        f"({collective.evidence})" if collective is not None else "collectives progress again")  # fmt: skip
            else:
                text = f"{key}: {prev} -> {state}"
            sev = "info" if state in quiet or state == "ok" else ("error" if state in ("failed", "lost") else "warning")
            self._notices.append(Notice(now, sev, "health", text))
        self._prev_states = current

    def _publish(self) -> bool:
        with self._lock:
            now = time.time()
            c0 = time.thread_time()
            state = self._build(now)
            cost = time.thread_time() - c0
            interval = max(self.cfg.publish_interval_s, cost / max(self.cfg.publish_cpu_share, 1e-3))
            if self._publisher is not None and interval != self._publisher.cfg.interval_s:
                self._publisher.cfg = replace(self._publisher.cfg, interval_s=min(interval, 5.0))
            key = (self._version, tuple((r.rank, r.state, r.blocked_by) for r in state.ranks),
                   tuple((n.name, n.state, n.detail) for n in state.nodes), state.collective is not None,
                   tuple((s.name, s.ok) for s in state.sources))  # fmt: skip
            changed = key != self._published_key
            self._published_key = key
            self._latest = state
            subs = list(self._subs) if changed else []
        for cb in subs:
            try:
                cb(state)
            except Exception as err:  # noqa: BLE001 - one broken subscriber must not stop the others
                with self._lock:
                    self._notices.append(Notice(time.time(), "error", "monitor", f"subscriber failed: {err!r}"[:300]))
        return False


def _run_config(text: str) -> dict[str, Any]:
    """run.toml with the trainer's defaults filled in (the collective timeout a run did not state is
    still the one it runs with); the raw table when it does not validate (another version's file)."""
    raw = tomllib.loads(text)
    try:
        from trainer.config import config_from_dict

        return config_from_dict(raw, "run.toml").model_dump(mode="json")
    except Exception:  # noqa: BLE001 - any validation problem: fall back to what the file says
        return raw


def _get(d: Mapping[str, Any], section: str, key: str) -> Any:
    sec = d.get(section) if isinstance(d, Mapping) else None
    return sec.get(key) if isinstance(sec, Mapping) else None


# --------------------------------------------------------------------------------- poller kinds


class _CallPoller(_Poller):
    def __init__(self, name: str, cfg: PollerConfig, fn: Callable[[], bool]):
        super().__init__(name, cfg)
        self._fn = fn

    def poll(self) -> bool:
        return self._fn()


class _FilesPoller(_Poller):
    def __init__(self, name: str, cfg: PollerConfig, tailer: Tailer, apply: Callable[[Any, float, str], None],
                 reader: str, always: bool = False):  # fmt: skip
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


class _LazyRemoteFiles:
    """RemoteFiles through the pool's current connection to `host` (reconnects after a drop)."""

    def __init__(self, mon: Monitor, host: str):
        self.mon = mon
        self.name = host

    def read(self, root, append, whole, known, max_bytes):
        runner = self.mon.pool().runner(self.name)
        return RemoteFiles(runner, timeout_s=self.mon.cfg.events.timeout_s).read(root, append, whole, known, max_bytes)


class _AgentPoller(_Poller):
    def __init__(self, mon: Monitor, host: str):
        super().__init__(f"agent@{host}", mon.cfg.agents)
        self.mon = mon
        self.host = host

    def poll(self) -> bool:
        mon, a = self.mon, self.mon._agents[self.host]
        now = time.time()
        with a.lock:
            if a.stream is None:
                if now < a.restart_at:
                    return False
                if a.first_open is None:
                    a.first_open = now  # from the first attempt: a node never reached is lost too
                try:
                    a.stream = mon._open_agent(self.host)
                except Exception as err:  # recorded on the node, then re-raised for its source
                    self._schedule_restart(a, now, f"cannot start: {err}")
                    raise
                a.opened_at = now
                a.last_line = None
                a.status = "starting"
            lines = a.stream.read_lines()
            exited = a.stream.exited
        if lines:
            mon._apply_agent_lines(a, lines, now)
        with a.lock:
            if a.stream is None:
                return False
            silent_since = a.last_line if a.last_line is not None else a.opened_at
            pol = mon.cfg.health
            # before its first line an agent may take longer (SSH session, python start on a busy node)
            timeout = pol.agent_timeout_s if a.last_line is not None else pol.agent_start_timeout_s
            if exited:
                tail = getattr(a.stream, "stderr_tail", b"")
                why = tail.decode(errors="replace").strip().splitlines()[-1:] if tail else []
                self._close(a)
                self._schedule_restart(a, now, "agent exited" + (f": {why[0]}" if why else ""))
            elif silent_since is not None and now - silent_since > max(timeout, 3 * mon.cfg.agent_interval_s):
                self._close(a)
                self._schedule_restart(a, now, f"agent silent for {now - silent_since:.0f} s")
        return False

    def problem(self) -> str:
        a = self.mon._agents[self.host]
        return a.status if (a.stream is None and a.status.startswith("restarting")) else ""

    @staticmethod
    def _close(a: _AgentState) -> None:
        try:
            if a.stream is not None:
                a.stream.close()
        finally:
            a.stream = None

    @staticmethod
    def _schedule_restart(a: _AgentState, now: float, why: str) -> None:
        a.restart_at = now + a.backoff
        a.status = f"restarting in {a.backoff:.0f} s: {why}"
        a.backoff = min(a.backoff * 2, 60.0)


# ------------------------------------------------------------------------------------ one-shot


def snapshot_once(run_dir: str | Path, *, hosts: Sequence[str] | None = None, pool: Any = None,
                  agents: bool = False, remote_files: bool = False, tensorboard: str | Path | None = None,
                  config: MonitorConfig | None = None, facts: Mapping[str, Any] | None = None,
                  rank_nodes: Mapping[int, str] | None = None) -> ClusterState:  # fmt: skip
    """One ClusterState read synchronously (what `taehv-console status --json` prints). With
    agents=True every node is sampled once (`agent --count 1`, over SSH for remote hosts);
    otherwise node states come from the ranks alone."""
    mon = Monitor(run_dir, hosts=hosts, pool=pool, agents=False, remote_files=remote_files, tensorboard=tensorboard,
                  config=config, facts=facts, rank_nodes=rank_nodes)  # fmt: skip
    try:
        if agents:
            for host in mon.hosts:
                a = mon._agents[host]
                a.first_open = time.time()
                try:
                    if mon._is_local(host):
                        from taehv_console.core.cluster.ssh import LocalRunner

                        runner: Any = LocalRunner(host)
                    else:
                        runner = mon.pool().runner(host)
                    argv = agent_argv(runner.python, str(mon.run_dir), 1.0) + ["--count", "1"]
                    res = runner.run(argv, timeout=30)
                    mon._apply_agent_lines(a, res.stdout.splitlines(), time.time())
                    if a.sample is None:
                        a.status = f"no sample (exit {res.exit_status}): {res.stderr.strip()[-200:]}"
                except Exception as err:  # noqa: BLE001 - this node's sample is missing; others still count
                    a.status = f"no sample: {err}"
            mon.agents_on = True
        return mon.poll_once()
    finally:
        if mon._own_pool and mon._pool is not None:
            mon._pool.close()
