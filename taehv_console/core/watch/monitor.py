"""The monitor: one ingestion pipeline per run. Pollers (scheduling.py) read each source on each
node (agents, events, heartbeats, logs, checkpoints, TensorBoard) into an Ingest; a publish job
builds the one immutable RunView (view.py) for subscribers: the TUI, --no-tui, status, attach.

    mon = Monitor(run_dir, hosts=["gpu1", "gpu2"], pool=pool).start()
    unsubscribe = mon.subscribe(lambda view: ...)   # called from a monitor thread on change
    ...
    mon.stop()

    view = snapshot_once(run_dir)                   # one synchronous read (`status --json`)

Pollers do their I/O outside the lock and apply results under it; the publish job re-evaluates
health on a tick, since "stalled" and "lost" arise from time passing, and hands out a view only
when something changed.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from taehv_console.core.cluster.hosts import is_local_host
from taehv_console.core.cluster.ssh import LocalRunner, NodeRunner, SshPool
from taehv_console.core.watch.checkpoints import CheckpointWatcher, RunActivity
from taehv_console.core.watch.health import HealthPolicy
from taehv_console.core.watch.ingest import AgentState, Ingest, get
from taehv_console.core.watch.scheduling import CallPoller, FilesPoller, Poller, PollerConfig, Scheduler
from taehv_console.core.watch.state import Notice, RankState, RunView
from taehv_console.core.watch.streams import LineStream, LocalLineStream, RemoteLineStream, agent_argv
from taehv_console.core.watch.tail import Chunk, ChunkSource, LocalFiles, RemoteFiles, Tailer
from taehv_console.core.watch.tbscalars import TensorBoardScalars
from taehv_console.core.watch.view import ViewBuilder

__all__ = ["LocalLineStream", "Monitor", "MonitorConfig", "PollerConfig", "snapshot_once"]


@dataclass(frozen=True)
class MonitorConfig:
    events: PollerConfig = PollerConfig(1.0, 30.0)
    heartbeats: PollerConfig = PollerConfig(1.0, 30.0)
    # Heartbeat files read per second at most: with 2,048 ranks on shared storage the heartbeat
    # poll stretches to every 4 s (a stall is still named within the 30 s bound), instead of
    # reading 2,048 files every second. Files whose inode, mtime and size did not change are not read.
    heartbeat_reads_per_s: float = 512.0
    logs: PollerConfig = PollerConfig(2.0, 30.0)
    checkpoints: PollerConfig = PollerConfig(10.0, 120.0)
    agents: PollerConfig = PollerConfig(1.0, 15.0)  # how often each agent's output is drained
    tensorboard: PollerConfig = PollerConfig(5.0, 60.0)
    publish_interval_s: float = 0.5  # health tick; views go out at most this often
    # ...and the tick stretches (to just under 1 s) so that building views costs at most this share
    # of one core: a 2,048-rank view takes ~15 ms to build when only the clock moved, ~30 ms after
    # every node's agent sampled (a 2-core machine; derived parts are kept between views), so at
    # that scale views go out at 1 Hz; a 64-node view (~6 ms) goes out every 0.5 s
    publish_cpu_share: float = 0.03
    agent_interval_s: float = 1.0
    # Agent samples the console parses per second at most: past 128 nodes each agent samples every
    # nodes/128 s (2 s at 256 nodes), since GPU telemetry at 0.5 Hz still shows a 2,048-GPU cluster
    # and parsing 256 samples a second was a fifth of the monitor's cost. Stalls come from
    # heartbeats, not from agents, so this does not slow naming a stall.
    agent_lines_per_s: float = 128.0
    agent_restart_s: float = 5.0  # first restart delay after an agent exits or goes silent (doubles)
    history_len: int = 600
    gpu_history_len: int = 120
    notices_len: int = 100
    signals_len: int = 200
    workers: int = 8
    local_read_bytes: int = 8 << 20
    remote_read_bytes: int = 2 << 20
    health: HealthPolicy = field(default_factory=HealthPolicy)


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

    def __init__(
        self,
        run_dir: str | Path,
        *,
        hosts: Sequence[str] | None = None,
        pool: SshPool | None = None,
        agents: bool = True,
        remote_files: bool = False,
        tensorboard: str | Path | None = None,
        rank_nodes: Mapping[int, str] | None = None,
        facts: Mapping[str, Any] | None = None,
        config: MonitorConfig | None = None,
        agent_stream: Callable[[str], LineStream] | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.cfg = c = config or MonitorConfig()
        self.local_mode = hosts is None
        self.hosts = list(hosts) if hosts is not None else [socket.gethostname()]
        self._pool = pool
        self._own_pool = False
        self.agents_on = agents
        self._agent_stream = agent_stream
        self.agent_interval_s = max(c.agent_interval_s, len(self.hosts) / max(c.agent_lines_per_s, 1.0))
        self.ingest = Ingest(
            self.hosts,
            local_mode=self.local_mode,
            rank_nodes=rank_nodes,
            history_len=c.history_len,
            notices_len=c.notices_len,
            signals_len=c.signals_len,
            gpu_history_len=c.gpu_history_len,
            agent_restart_s=c.agent_restart_s,
            rank_window=max(c.health.straggler_window * 2, 16),
        )
        self._lock = self.ingest.lock
        self.builder = ViewBuilder(
            self.ingest, str(self.run_dir), self.run_dir.name, c.health, c.notices_len, facts
        )
        self._subs: list[Callable[[RunView], object]] = []
        self._ckpt = CheckpointWatcher(self.run_dir / "checkpoints")
        self._tb = None
        if tensorboard is not None:
            self._tb = TensorBoardScalars(tensorboard, c.history_len)
        self._published_key: tuple[int, RunView] | None = None  # (ingest version, view) last handed out
        self._latest: RunView | None = None
        self._started = False
        self._sched: Scheduler | None = None
        self._publisher: Poller | None = None
        self._pollers: list[Poller] = self._make_pollers()
        if remote_files:
            self._use_remote_files()

    @property
    def _agents(self) -> dict[str, AgentState]:
        return self.ingest.agents

    # ------------------------------------------------------------------ lifecycle
    def _make_pollers(self) -> list[Poller]:
        c = self.cfg
        ps: list[Poller] = []
        if self.agents_on:
            ps += [_AgentPoller(self, h) for h in self.hosts]
        ps += self._file_pollers("", LocalFiles(), c.local_read_bytes)
        ps.append(CallPoller("checkpoints", c.checkpoints, self._poll_checkpoints))
        if self._tb is not None:
            ps.append(CallPoller("tensorboard", c.tensorboard, self._poll_tensorboard))
        return ps

    def _file_pollers(self, suffix: str, src: ChunkSource, nbytes: int) -> list[Poller]:
        c, d, ing = self.cfg, self.run_dir, self.ingest
        return [
            FilesPoller(
                f"events{suffix}",
                c.events,
                Tailer(
                    d,
                    src,
                    append=["events/rank-*.jsonl"],
                    whole=["state.json", "run.toml", "forensics/report-*.json"],
                    max_bytes=nbytes,
                ),
                ing.apply_events,
                suffix,
            ),
            _HeartbeatPoller(
                f"heartbeats{suffix}",
                c.heartbeats,
                Tailer(d, src, whole=["heartbeat/rank-*.json"], max_bytes=nbytes),
                ing.apply_heartbeats,
                suffix,
                c.heartbeat_reads_per_s,
            ),
            # always applied: a root-cause block at the end of a quiet log is flushed
            FilesPoller(
                f"logs{suffix}",
                c.logs,
                Tailer(d, src, append=["logs/*.log"], max_bytes=nbytes),
                ing.apply_logs,
                suffix,
                always=True,
            ),
        ]

    def _use_remote_files(self) -> None:
        """Events, heartbeats and logs through each node's runner: a run directory this machine
        does not see (each node's own copy holds its own ranks' files)."""
        self._pollers = [p for p in self._pollers if not isinstance(p, FilesPoller)]
        for h in self.hosts:
            self._pollers += self._file_pollers(
                f"@{h}", _LazyRemoteFiles(self, h), self.cfg.remote_read_bytes
            )

    def start(self) -> Monitor:
        if self._started:
            return self
        self._started = True
        self._sched = Scheduler(self.cfg.workers)
        for i, p in enumerate(self._pollers):
            self._sched.add(p, delay=0.001 * i)  # a small stagger: 64 agents do not wake as one
        self._publisher = CallPoller(
            "publish", PollerConfig(self.cfg.publish_interval_s, 30.0), self._publish
        )
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

    def subscribe(self, callback: Callable[[RunView], object]) -> Callable[[], None]:
        """callback(view) on every changed view, from a monitor thread (a UI posts a message from
        it). Returns a function that unsubscribes."""
        with self._lock:
            self._subs.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subs:
                    self._subs.remove(callback)

        return unsubscribe

    def snapshot(self) -> RunView:
        """The newest published view (built now if none has been)."""
        latest = self._latest
        if latest is None:
            with self._lock:
                latest = self._latest = self._build(time.time())
        return latest

    def poll_once(self, at: float | None = None) -> RunView:
        """Every poller once, here and now (draining backlogs), then a view (as of `at`: a recorded
        run directory judged at the time it was recorded). For one-shot use; not while started."""
        for p in self._pollers:
            for _ in range(10_000):
                try:
                    if not p.run_once():
                        break
                except Exception:  # noqa: BLE001 - recorded on the source, as the scheduler would
                    break
        with self._lock:
            self._latest = self._build(time.time() if at is None else at)
        return self._latest

    def read_now(self, *sources: str) -> RunView:
        """The named sources (pollers whose name starts with one of them: "events", "heartbeats")
        read once each, then a view built now: the last word on a run that has just ended, while
        the scheduler may still be running."""
        for p in self._pollers:
            if p.name.startswith(sources):
                with contextlib.suppress(Exception):  # recorded on the source, as the scheduler would
                    p.run_once()
        with self._lock:
            return self._build(time.time())

    # ------------------------------------------------------------------ runners
    def pool(self) -> SshPool:
        if self._pool is None:
            self._pool = SshPool()
            self._own_pool = True
        return self._pool

    def _is_local(self, host: str) -> bool:
        return self.local_mode or is_local_host(host)

    def _runner(self, host: str) -> NodeRunner:
        if self._is_local(host):
            return LocalRunner(host)
        return self.pool().runner(host)

    def _open_agent(self, host: str) -> LineStream:
        if self._agent_stream is not None:
            return self._agent_stream(host)
        if self._is_local(host):
            return LocalLineStream(agent_argv(sys.executable, str(self.run_dir), self.agent_interval_s))
        runner = self.pool().runner(host)
        return RemoteLineStream(runner, agent_argv(runner.python, str(self.run_dir), self.agent_interval_s))

    # ------------------------------------------------------------------ polls that are not files
    def _poll_checkpoints(self) -> bool:
        ing = self.ingest
        with self._lock:
            # While running, the published view's rank states (at most a tick old; assessing 2,048
            # ranks again here cost as much as a view); a one-shot read has built no view yet.
            latest = self._latest if self._started else None
            ranks = latest.ranks if latest is not None else self.builder.ranks(time.time())[0]
            live = any(h.state not in (RankState.STOPPED, RankState.FAILED) for h in ranks)
            activity = RunActivity(
                live=live,
                step=ing.current_step(),
                max_steps=ing.max_steps(),
                every=get(ing.run_cfg, "schedule", "checkpoint_every"),
                events=dict(ing.fold.checkpoints) if ing.fold.ranks else None,
            )
        ing.set_checkpoints(self._ckpt.summary(activity))
        return False

    def _poll_tensorboard(self) -> bool:
        assert self._tb is not None
        if self._tb.poll():
            with self._lock:
                self.ingest.version += 1
        return False

    # ------------------------------------------------------------------ views
    def _build(self, now: float) -> RunView:
        mono = time.monotonic()
        return self.builder.build(
            now, agents_on=self.agents_on, tb=self._tb, sources=tuple(p.status(mono) for p in self._pollers)
        )

    def _publish(self) -> bool:
        started = time.monotonic()
        with self._lock:
            c0 = time.thread_time()
            view = self._build(time.time())
            cost = time.thread_time() - c0
            # New facts, or the same facts judged differently as time passed (a rank gone stale);
            # walking 2,048 ranks to tell is needed only when nothing new came in.
            prev = self._published_key
            changed = (
                prev is None or prev[0] != self.ingest.version or _health_key(view) != _health_key(prev[1])
            )
            self._published_key = (self.ingest.version, view)
            self._latest = view
            subs = list(self._subs) if changed else []
        for cb in subs:
            try:
                cb(view)
            except Exception as err:  # noqa: BLE001 - one broken subscriber must not stop the others
                with self._lock:
                    self.ingest.notices.append(
                        Notice(time.time(), "error", "monitor", f"subscriber failed: {err!r}"[:300])
                    )
        if self._publisher is not None:
            # The period from one view to the next (the scheduler waits interval_s after a poll
            # ends): as the CPU share allows, but never longer than _MAX_PUBLISH_PERIOD_S, since a
            # stall must reach every front end within its bound.
            share = max(self.cfg.publish_cpu_share, 1e-3)
            period = min(max(self.cfg.publish_interval_s, cost / share), _MAX_PUBLISH_PERIOD_S)
            self._publisher.interval_s = max(0.0, period - (time.monotonic() - started))
        return False


# views go out at >= 1 Hz whatever they cost: a little under 1 s from start to start, leaving room
# for the scheduler's own latency
_MAX_PUBLISH_PERIOD_S = 0.95


def _health_key(view: RunView) -> tuple:
    return (
        tuple((r.rank, r.state, r.blocked_by) for r in view.ranks),
        tuple((n.name, n.state, n.detail) for n in view.nodes),
        view.collective is not None,
        tuple((s.name, s.ok) for s in view.sources),
    )


# --------------------------------------------------------------------------------- poller kinds


class _HeartbeatPoller(FilesPoller):
    """Heartbeats, read no more often than `reads_per_s` files a second allow (see MonitorConfig)."""

    def __init__(
        self,
        name: str,
        cfg: PollerConfig,
        tailer: Tailer,
        apply: Callable[[Any, float, str], None],
        reader: str,
        reads_per_s: float,
    ):
        super().__init__(name, cfg, tailer, apply, reader)
        self.reads_per_s = reads_per_s

    def poll(self) -> bool:
        more = super().poll()
        files = len(self.tailer._known)
        self.interval_s = max(self.cfg.interval_s, files / max(self.reads_per_s, 1.0))
        return more


class _LazyRemoteFiles:
    """RemoteFiles through the pool's current connection to `host` (reconnects after a drop)."""

    def __init__(self, mon: Monitor, host: str):
        self.mon = mon
        self.name = host

    def read(
        self,
        root: str,
        append: Sequence[str],
        whole: Sequence[str],
        known: Mapping[str, Sequence[int]],
        max_bytes: int,
    ) -> list[Chunk]:
        runner = self.mon.pool().runner(self.name)
        return RemoteFiles(runner, timeout_s=self.mon.cfg.events.timeout_s).read(
            root, append, whole, known, max_bytes
        )


class _AgentPoller(Poller):
    def __init__(self, mon: Monitor, host: str):
        cfg = mon.cfg.agents
        # drained as often as its agent samples, no more
        super().__init__(f"agent@{host}", replace(cfg, interval_s=max(cfg.interval_s, mon.agent_interval_s)))
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
            mon.ingest.apply_agent_lines(a, lines, now)
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
            elif silent_since is not None and now - silent_since > max(timeout, 3 * mon.agent_interval_s):
                self._close(a)
                self._schedule_restart(a, now, f"agent silent for {now - silent_since:.0f} s")
        return False

    def problem(self) -> str:
        a = self.mon._agents[self.host]
        return a.status if (a.stream is None and a.status.startswith("restarting")) else ""

    @staticmethod
    def _close(a: AgentState) -> None:
        try:
            if a.stream is not None:
                a.stream.close()
        finally:
            a.stream = None

    @staticmethod
    def _schedule_restart(a: AgentState, now: float, why: str) -> None:
        a.restart_at = now + a.backoff
        a.status = f"restarting in {a.backoff:.0f} s: {why}"
        a.backoff = min(a.backoff * 2, 60.0)


# ------------------------------------------------------------------------------------ one-shot


def snapshot_once(
    run_dir: str | Path,
    *,
    hosts: Sequence[str] | None = None,
    pool: SshPool | None = None,
    agents: bool = False,
    remote_files: bool = False,
    tensorboard: str | Path | None = None,
    config: MonitorConfig | None = None,
    facts: Mapping[str, Any] | None = None,
    rank_nodes: Mapping[int, str] | None = None,
    at: float | None = None,
) -> RunView:
    """One RunView read synchronously (what `taehv-console status --json` prints). With
    agents=True every node is sampled once (`agent --count 1`, over SSH for remote hosts);
    otherwise node states come from the ranks alone."""
    mon = Monitor(
        run_dir,
        hosts=hosts,
        pool=pool,
        agents=False,
        remote_files=remote_files,
        tensorboard=tensorboard,
        config=config,
        facts=facts,
        rank_nodes=rank_nodes,
    )
    try:
        if agents:
            for host in mon.hosts:
                a = mon._agents[host]
                a.first_open = time.time()
                try:
                    runner = mon._runner(host)
                    _python, _m, module, *args = agent_argv(runner.python, str(mon.run_dir), 1.0)
                    reply = runner.call(module, [*args, "--count", "1"], timeout=30, require=("host", "time"))
                    if reply.ok:
                        mon.ingest.apply_agent_lines(a, [json.dumps(dict(reply.data))], time.time())
                    if a.sample is None:
                        a.status = f"no sample: {reply.why or 'not an agent sample'}"
                except Exception as err:  # noqa: BLE001 - this node's sample is missing; others still count
                    a.status = f"no sample: {err}"
            mon.agents_on = True
        return mon.poll_once(at)
    finally:
        if mon._own_pool and mon._pool is not None:
            mon._pool.close()
