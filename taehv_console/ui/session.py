"""The run this console follows: as the client of the run's supervisor (core/run/client.py: no
lock held; stop and hurry are requests, resume takes the lock for the launch only), or, with no
supervisor (TAEHV_SUPERVISOR=off, a platform pod), under core's RunController with its lock held
for the session; the Monitor that watches the run's nodes; and the follow loop. Called from
thread workers; nothing here imports Textual. Callbacks run on worker or monitor threads: the app
turns them into messages with post_message, the only thread-safe way into the UI.

Quitting the console detaches: the follow loop returns without stopping anything, and the
launchers (started detached, in their own sessions) keep training under the run's supervisor.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from taehv_console.core.flow.options import FlowOptions
from taehv_console.core.run.client import RunClient, client_mode, supervised_client
from taehv_console.core.run.control import RunController
from taehv_console.core.run.create import create_run
from taehv_console.core.run.outcome import RunLiveError, settled, stop_grace_s
from taehv_console.core.run.recovery import Stall
from taehv_console.core.run.rundir import RunDir, create_run_dir
from taehv_console.core.watch.runwatch import RunWatch, monitor_hosts

if TYPE_CHECKING:  # annotations only: flow.launch loads the planner's pydantic models
    from taehv_console.core.cluster.ssh import SshPool
    from taehv_console.core.flow.launch import Review
    from taehv_console.core.models import NodeFacts
    from taehv_console.core.run.outcome import Outcome, ResumePoint, RunSnapshot
    from taehv_console.core.run.state import Phase, RunState
    from taehv_console.core.watch.monitor import Monitor, MonitorConfig
    from taehv_console.core.watch.state import RunView


class _Detached(Exception):
    """Raised inside the follow loop's callback to leave it without stopping the run."""


class RunSession:
    """One run in this console: `client` while the run's supervisor controls it, else `ctrl`
    (exactly one of them)."""

    def __init__(
        self,
        run: RunDir,
        pool: SshPool,
        facts: dict[str, NodeFacts] | None = None,
        *,
        ctrl: RunController | None = None,
        client: RunClient | None = None,
    ):
        assert (ctrl is None) != (client is None), "a session follows through one of them"
        self.run = run
        self.ctrl = ctrl
        self.client = client
        self.pool = pool
        self.facts = dict(facts or {})
        self.monitor: Monitor | None = None
        self.watch: RunWatch | None = None
        self._stop = threading.Event()
        self._detach = threading.Event()
        self._following = threading.Lock()
        self.hurry = False

    # ------------------------------------------------------------------ opening
    @classmethod
    def _of(cls, ctrl: RunController, facts: dict[str, NodeFacts] | None = None) -> RunSession:
        """A session for a run this console has just launched, resumed or opened: its supervisor's
        client where one keeps the run (the lock goes to it), else under this console's control."""
        if client_mode(ctrl.kind):
            return cls(ctrl.run, ctrl.pool, facts, client=RunClient.hand_over(ctrl))
        return cls(ctrl.run, ctrl.pool, facts, ctrl=ctrl)

    @classmethod
    def launch(
        cls, options: FlowOptions, review: Review, pool: SshPool, facts: dict[str, NodeFacts] | None = None
    ) -> RunSession:
        """Create the reviewed run (the same id, path, hosts, master and environment the review
        showed) and start every node."""
        # the id the review showed is made from the review's time
        run_dir = create_run_dir(options.runs, review.config.run.preset, now=review.created_at)
        run = create_run(options.runs, review.config, review.spec, run=run_dir)
        ctrl = RunController.open(run, pool, purpose="launch (console)")
        if options.grace_s:
            ctrl.grace_s = options.grace_s  # before the launch: torchrun's own shutdown wait follows it
        try:
            ctrl.launch()
        except BaseException:
            ctrl.close()
            raise
        return cls._of(ctrl, facts)

    @classmethod
    def attach(cls, run_path: str, pool: SshPool) -> tuple[RunSession, str]:
        """Open an existing run: ('live', session) when it goes on (its processes run, or a
        failure waits to be judged, or a restart is due), else the attempt is concluded from what
        it left ('ended'). RunBusyError when a console without a supervisor controls it."""
        run = RunDir(Path(run_path))
        client = supervised_client(run, pool)
        if client is not None and not client.settled():
            return cls(run, pool, client=client), "live"
        ctrl = RunController.open(run, pool, purpose="attach (console)")
        try:
            how = ctrl.reconcile()
        except BaseException:
            ctrl.close()
            raise
        if how != "live" and not settled(ctrl.state):
            how = "live"  # a failure to judge, a restart's backoff: the follow loop carries it on
        if how == "live":
            return cls._of(ctrl), how
        if client_mode(ctrl.kind):  # nothing to hold it for: resume takes the lock for its launch
            ctrl.close()
            return cls(run, pool, client=RunClient(run, pool)), how
        return cls(run, pool, ctrl=ctrl), how

    # ------------------------------------------------------------------ reading
    @property
    def state(self) -> RunState:
        if self.client is not None:
            return self.client.state
        assert self.ctrl is not None
        return self.ctrl.state

    @property
    def phase(self) -> Phase:
        return self.state.phase

    @property
    def grace_s(self) -> float:
        if self.ctrl is not None:
            return self.ctrl.grace_s
        assert self.client is not None
        return self.client.grace_s or stop_grace_s(self.client.cfg)

    def outcome(self) -> Outcome:
        if self.client is not None:
            self.client.refresh()
            return self.client.outcome()
        assert self.ctrl is not None
        return self.ctrl.outcome()

    def describe(self) -> tuple[str, ...]:
        if self.client is not None:
            return tuple(self.client.describe())
        assert self.ctrl is not None
        a = self.ctrl.attempt
        return tuple(self.ctrl.backend.describe(a)) if a is not None else ()

    # ------------------------------------------------------------------ watching
    def monitor_hosts(self) -> list[str] | None:
        return monitor_hosts(self.state.backend, self.state.hosts)

    def start_monitor(
        self, on_state: Callable[[RunView], object], config: MonitorConfig | None = None
    ) -> Monitor:
        """The run's one watch pipeline, as --no-tui follows it; with stall forensics when this
        console controls the run (a supervisor's watch takes them otherwise)."""
        if self.monitor is None:
            state = self.state
            self.watch = RunWatch(
                self.run.path,
                self.pool,
                state.backend,
                state.hosts,
                config=config,
                facts=self.facts,
                hosts_of=lambda: self.state.hosts,
                respond=self.ctrl is not None,
            )
            self.monitor = self.watch.monitor
            self.watch.subscribe(on_state)  # also the pipelines that follow a change of hosts
            self.watch.start()
        return self.monitor

    def node_index(self, name: str) -> int | None:
        """Machine rank of a node as the monitor names it (its log is logs/node-<i>.log)."""
        hosts = self.monitor_hosts()
        if hosts is None:
            return 0 if len(self.state.hosts) <= 1 else None
        return hosts.index(name) if name in hosts else None

    # ------------------------------------------------------------------ control
    @property
    def following(self) -> bool:
        return self._following.locked()

    def follow(self, on_update: Callable[[RunSnapshot], object]) -> Outcome | None:
        """Follow the run until it ends (Outcome) or the console detaches (None). A stop asked
        with request_stop() is carried out by whoever controls the run: SIGTERM, checkpoint,
        verify (the supervisor, asked through stop.request, or core's follow loop here)."""

        def update(snapshot: RunSnapshot) -> None:
            on_update(snapshot)
            # this console's own stop is finished first: leaving it half done would leave the run
            # stopping (a supervisor finishes the stops it was asked for whoever watches)
            if self._detach.is_set() and (self.client is not None or not self._stop.is_set()):
                raise _Detached

        with self._following:
            self._stop.clear()
            try:
                if self.client is not None:
                    return self.client.follow(update, should_stop=self._stop.is_set, hurry=lambda: self.hurry)
                assert self.ctrl is not None
                return self.ctrl.follow(
                    update, should_stop=self._stop.is_set, stalls=self._stalls, hardware=self._hardware
                )
            except _Detached:
                return None

    def _stalls(self) -> list[Stall]:
        return self.watch.stalls() if self.watch is not None else []

    def _hardware(self) -> dict[str, str]:
        return self.watch.hardware() if self.watch is not None else {}

    def request_stop(self) -> None:
        self._stop.set()

    def hurry_stop(self) -> None:
        self.hurry = True
        if self.ctrl is not None:
            self.ctrl.hurry = True

    def resume(self, weights_only: bool = False) -> ResumePoint:
        """Relaunch from the newest complete checkpoint (RunLiveError while it runs). A client
        takes the run's lock for the launch, then hands the run to its supervisor again."""
        if self.following:
            raise RunLiveError(f"{self.run.run_id} is running: stop it before resuming")
        ctrl = self.ctrl or RunController.open(self.run, self.pool, purpose="resume (console)")
        try:
            point = ctrl.resume_point(weights_only=weights_only)
            ctrl.launch(resume=point.spec, weights_only=weights_only)
        except BaseException:
            if ctrl is not self.ctrl:
                ctrl.close()
            raise
        if self.client is not None or client_mode(ctrl.kind):
            self.ctrl, self.client = None, RunClient.hand_over(ctrl)
        self.hurry = False
        return point

    def detach(self) -> None:
        self._detach.set()

    def close(self) -> None:
        """Stop watching and let go of the run (nothing of the run itself is stopped)."""
        self._detach.set()
        if self.monitor is not None:
            assert self.watch is not None  # started with the monitor
            self.watch.stop()
            self.monitor = None
        # the follow loop leaves at its next callback (within ~2 s); the lock goes with it
        with self._following:
            if self.ctrl is not None:
                self.ctrl.close()
