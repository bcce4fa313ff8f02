"""A run being followed: its one Monitor (the RunView every front end renders) and the stall
responder, which runs forensics once per newly confirmed stall on a background thread, so the view
keeps refreshing while py-spy and Flight Recorder take their seconds. Reports are written to the
run directory (forensics/report-*.json); the monitor reads them back into the view like any other
source, so `status --json` on another machine shows the same stack.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.forensics import ForensicsReport, RankRef, StallForensics
from taehv_console.core.models import BackendKind
from taehv_console.core.run.recovery import Stall, where_stalled
from taehv_console.core.watch.hardware import first_gpu_counts, hardware_evidence
from taehv_console.core.watch.monitor import Monitor, MonitorConfig
from taehv_console.core.watch.state import RankHealth, RankState, RunView
from taehv_console.core.watch.streams import LineStream
from trainer.events import atomic_write_text

if TYPE_CHECKING:
    from taehv_console.core.run.client import RunClient
    from taehv_console.core.run.control import RunController

REPORT_GLOB = "forensics/report-*.json"


def monitor_hosts(kind: BackendKind, hosts: Sequence[str]) -> list[str] | None:
    """The nodes a monitor watches for a run as state.json records it; None: this machine only
    (a local run, or loopback "nodes" sharing one name)."""
    hosts = list(hosts)
    if kind is BackendKind.LOCAL or len(set(hosts)) != len(hosts) or not hosts:
        return None
    return hosts


class StallResponder:
    """Subscribed to a Monitor: each rank that turns stalled (once per process and stall) gets one
    StallForensics.collect() on a thread of its own; the report lands in RUN/forensics/."""

    def __init__(
        self, run_dir: Path, pool: SshPool, hosts: Sequence[str], forensics: StallForensics | None = None
    ):
        self.run_dir = Path(run_dir)
        self.hosts = list(hosts)
        self.forensics = forensics or StallForensics(self.run_dir, pool)
        self._done: set[tuple[int, int | None]] = set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def __call__(self, view: RunView) -> None:
        stalled = {(r.rank, r.pid) for r in view.stalled}
        with self._lock:
            # a stall that cleared and came back is a new one: forget the ones no longer stalled
            self._done &= stalled
            new = [r for r in view.stalled if (r.rank, r.pid) not in self._done and r.pid is not None]
            self._done.update((r.rank, r.pid) for r in new)
        for r in new:
            t = threading.Thread(
                target=self._collect,
                args=(r, self._peer(view, r)),
                daemon=True,
                name=f"taehv-forensics-rank-{r.rank}",
            )
            self._threads.append(t)
            t.start()

    def _ref(self, r: RankHealth) -> RankRef:
        node = self.hosts.index(r.node) if r.node in self.hosts else 0
        return RankRef(rank=r.rank, node=node, host=r.node, pid=int(r.pid or 0))

    def _peer(self, view: RunView, stalled: RankHealth) -> RankHealth | None:
        live = [
            r
            for r in view.ranks
            if r.rank != stalled.rank
            and r.pid is not None
            and r.state not in (RankState.FAILED, RankState.STOPPED)
        ]
        blocked = [r for r in live if r.blocked_by == stalled.rank]
        candidates = blocked or live
        return candidates[0] if candidates else None

    def _collect(self, r: RankHealth, peer: RankHealth | None) -> None:
        path = self.run_dir / f"forensics/report-rank-{r.rank}-{int(time.time() * 1000)}.json"
        extra = {"stalled": {"rank": r.rank, "node": r.node, "pid": r.pid}, "detail": r.detail}

        def save(report: ForensicsReport) -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps({**report.to_json(), **extra}, default=str))

        try:
            save(self.forensics.collect(self._ref(r), self._ref(peer) if peer else None, on_partial=save))
        except Exception as err:  # noqa: BLE001 - forensics must never take the console down: say why instead
            report = ForensicsReport(
                stalled_rank=r.rank,
                dumps=(),
                notes=(f"forensics failed: {err!r}"[:300],),
                flight_recorder=(),
                ras=None,
                time=time.time(),
            )
            try:
                save(report)
            except OSError:
                pass

    def join(self, timeout: float = 5.0) -> None:
        for t in self._threads:
            t.join(timeout)


class RunWatch:
    """The one pipeline for a followed run: Monitor + StallResponder. view() is the newest RunView.

    It also keeps each node's GPU count from its first agent sample with GPUs, noted on every view
    the monitor hands out, so `hardware()` can tell GPUs gone since then (a view holds only the
    newest sample)."""

    def __init__(
        self,
        run_dir: Path,
        pool: SshPool,
        kind: BackendKind,
        hosts: Sequence[str],
        *,
        agents: bool = True,
        config: MonitorConfig | None = None,
        facts: dict | None = None,
        forensics: StallForensics | None = None,
        agent_stream: Callable[[str], LineStream] | None = None,
        hosts_of: Callable[[], Sequence[str]] | None = None,
        respond: bool = True,
    ):
        self.run_dir = Path(run_dir)
        # False: a console following a supervised run; the supervisor's watch takes the forensics
        self._respond = respond
        self._pool, self._kind = pool, kind
        self._agents, self._config, self._facts = agents, config, facts
        self._agent_stream, self._forensics = agent_stream, forensics
        # where the run's hosts are now (the controller's state): a node left out or replaced by a
        # spare is followed by a new pipeline for the new hosts
        self._hosts_of = hosts_of
        self._hosts = tuple(hosts)
        self._subscribers: list[Callable[[RunView], object]] = []
        self._swap = threading.Lock()
        self._started = False
        self._first_gpus: Mapping[str, int] = {}
        self._first_lock = threading.Lock()
        self.monitor, self.responder = self._pipeline(self._hosts)

    def _pipeline(self, hosts: Sequence[str]) -> tuple[Monitor, StallResponder | None]:
        watched = monitor_hosts(self._kind, hosts)
        monitor = Monitor(
            self.run_dir,
            hosts=watched,
            pool=self._pool,
            agents=self._agents,
            config=self._config,
            facts=self._facts,
            agent_stream=self._agent_stream,
        )
        responder = None
        if self._respond:
            responder = StallResponder(self.run_dir, self._pool, watched or list(hosts)[:1], self._forensics)
            monitor.subscribe(responder)
        monitor.subscribe(self._note_first_gpus)
        for fn in self._subscribers:
            monitor.subscribe(fn)
        return monitor, responder

    @classmethod
    def for_controller(cls, ctrl: RunController, **kw: Any) -> RunWatch:
        return cls(
            ctrl.run.path, ctrl.pool, ctrl.kind, ctrl.state.hosts, hosts_of=lambda: ctrl.state.hosts, **kw
        )

    @classmethod
    def for_client(cls, client: RunClient, **kw: Any) -> RunWatch:
        """The watch of a console following a supervised run: the same view, no forensics (the
        supervisor's watch takes them, and its reports reach this view from the run directory)."""
        return cls(
            client.run.path,
            client.pool,
            client.kind,
            client.state.hosts,
            hosts_of=lambda: client.state.hosts,
            respond=False,
            **kw,
        )

    def subscribe(self, fn: Callable[[RunView], object]) -> None:
        """fn(view) for every view published, by this pipeline and by the ones that follow it."""
        self._subscribers.append(fn)
        self.monitor.subscribe(fn)

    def follow_hosts(self) -> bool:
        """When the run's hosts changed (a node left out, a spare in its place), watch the new ones:
        a new monitor and stall responder, the old ones stopped; True when it did."""
        if self._hosts_of is None:
            return False
        hosts = tuple(self._hosts_of())
        if hosts == self._hosts:
            return False
        with self._swap:
            if hosts == self._hosts:
                return False
            old = (self.monitor, self.responder)
            self.monitor, self.responder = self._pipeline(hosts)
            self._hosts = hosts
            if self._started:
                self.monitor.start()
        old[0].stop()
        if old[1] is not None:
            old[1].join(timeout=1.0)
        return True

    def start(self) -> RunWatch:
        self._started = True
        self.monitor.start()
        return self

    def view(self) -> RunView:
        self.follow_hosts()
        return self.monitor.snapshot()

    def stalls(self) -> list[Stall]:
        """The ranks the newest view names as stalled, as the run controller's recovery reads them."""
        view = self.view()
        stalls = []
        for r in view.stalled:
            found = view.forensics_for(r.rank)
            stalls.append(
                Stall(
                    rank=r.rank,
                    node=r.node,
                    stalled_s=r.heartbeat_age_s or 0.0,
                    step_time_s=r.step_time_s,
                    forensics=found is not None,
                    where=where_stalled(found.frames) if found is not None else "",
                )
            )
        return stalls

    def hardware(self) -> dict[str, str]:
        """node -> why its hardware is bad, from the newest view's agent samples (a GPU lost,
        uncorrectable ECC errors, GPUs or NVML gone since its first sample), as the run
        controller's recovery reads it; nodes without such evidence are absent."""
        view = self.view()
        return hardware_evidence(view, self._note_first_gpus(view))

    def _note_first_gpus(self, view: RunView) -> Mapping[str, int]:
        # every view the monitor hands out, and the one hardware() reads: a node's first count is
        # kept even when no one asks until after its GPUs are gone
        with self._first_lock:
            self._first_gpus = first_gpu_counts(view, self._first_gpus)
            return self._first_gpus

    def final_view(self) -> RunView:
        """A view built now, after the run ended (state.json and the last events read)."""
        return self.monitor.read_now("events", "heartbeats")

    def stop(self) -> None:
        self.monitor.stop()
        if self.responder is not None:
            self.responder.join(timeout=1.0)
