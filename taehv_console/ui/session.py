"""The run this console controls: core's RunController (its lock held for the session), the
Monitor that watches the run's nodes, and the follow loop. Called from thread workers; nothing
here imports Textual. Callbacks run on worker or monitor threads: the app turns them into
messages with post_message, the only thread-safe way into the UI.

Quitting the console detaches: the follow loop returns without stopping anything, the lock is
released, and the launchers (started detached, in their own sessions) keep training.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from taehv_console.core.flow.options import FlowOptions
from taehv_console.core.run.control import RunController
from taehv_console.core.run.create import create_run
from taehv_console.core.run.outcome import RunLiveError
from taehv_console.core.run.recovery import Stall
from taehv_console.core.run.rundir import RunDir, create_run_dir
from taehv_console.core.watch.runwatch import RunWatch, monitor_hosts

if TYPE_CHECKING:  # annotations only: flow.launch loads the planner's pydantic models
    from taehv_console.core.cluster.ssh import SshPool
    from taehv_console.core.flow.launch import Review
    from taehv_console.core.models import NodeFacts
    from taehv_console.core.run.outcome import Outcome, ResumePoint, RunSnapshot
    from taehv_console.core.run.state import Phase
    from taehv_console.core.watch.monitor import Monitor, MonitorConfig
    from taehv_console.core.watch.state import RunView


class _Detached(Exception):
    """Raised inside the follow loop's callback to leave it without stopping the run."""


class RunSession:
    def __init__(
        self, run: RunDir, ctrl: RunController, pool: SshPool, facts: dict[str, NodeFacts] | None = None
    ):
        self.run = run
        self.ctrl = ctrl
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
    def launch(
        cls, options: FlowOptions, review: Review, pool: SshPool, facts: dict[str, NodeFacts] | None = None
    ) -> RunSession:
        """Create the reviewed run (the same id, path, hosts, master and environment the review
        showed) and start every node."""
        # the id the review showed is made from the review's time
        run_dir = create_run_dir(options.runs, review.config.run.preset, now=review.created_at)
        run = create_run(options.runs, review.config, review.spec, run=run_dir)
        ctrl = RunController.open(run, pool, purpose="launch (console)")
        session = cls(run, ctrl, pool, facts)
        if options.grace_s:
            ctrl.grace_s = options.grace_s  # before the launch: torchrun's own shutdown wait follows it
        try:
            ctrl.launch()
        except BaseException:
            session.close()
            raise
        return session

    @classmethod
    def attach(cls, run_path: str, pool: SshPool) -> tuple[RunSession, str]:
        """Take control of an existing run: ('live', session) when its processes run, else the
        attempt is concluded from what it left ('ended'). RunBusyError when another console has it."""
        run = RunDir(Path(run_path))
        ctrl = RunController.open(run, pool, purpose="attach (console)")
        session = cls(run, ctrl, pool)
        try:
            how = ctrl.reconcile()
        except BaseException:
            session.close()
            raise
        return session, how

    # ------------------------------------------------------------------ watching
    def monitor_hosts(self) -> list[str] | None:
        return monitor_hosts(self.ctrl.kind, self.ctrl.state.hosts)

    def start_monitor(
        self, on_state: Callable[[RunView], object], config: MonitorConfig | None = None
    ) -> Monitor:
        """The run's one watch pipeline (with stall forensics), as --no-tui follows it."""
        if self.monitor is None:
            self.watch = RunWatch.for_controller(self.ctrl, config=config, facts=self.facts)
            self.monitor = self.watch.monitor
            self.watch.subscribe(on_state)  # also the pipelines that follow a change of hosts
            self.watch.start()
        return self.monitor

    def node_index(self, name: str) -> int | None:
        """Machine rank of a node as the monitor names it (its log is logs/node-<i>.log)."""
        hosts = self.monitor_hosts()
        if hosts is None:
            return 0 if self.ctrl.cfg.topology.nodes == 1 else None
        return hosts.index(name) if name in hosts else None

    # ------------------------------------------------------------------ control
    @property
    def phase(self) -> Phase:
        return self.ctrl.state.phase

    @property
    def following(self) -> bool:
        return self._following.locked()

    def follow(self, on_update: Callable[[RunSnapshot], object]) -> Outcome | None:
        """Follow the run until it ends (Outcome) or the console detaches (None). A stop asked
        with request_stop() is carried out by core's follow loop: SIGTERM, checkpoint, verify."""

        def update(snapshot: RunSnapshot) -> None:
            on_update(snapshot)
            # a stop in progress is finished first: leaving it half done would leave the run stopping
            if self._detach.is_set() and not self._stop.is_set():
                raise _Detached

        with self._following:
            self._stop.clear()
            try:
                outcome = self.ctrl.follow(
                    update, should_stop=self._stop.is_set, stalls=self._stalls, hardware=self._hardware
                )
            except _Detached:
                return None
            return outcome

    def _stalls(self) -> list[Stall]:
        return self.watch.stalls() if self.watch is not None else []

    def _hardware(self) -> dict[str, str]:
        return self.watch.hardware() if self.watch is not None else {}

    def request_stop(self) -> None:
        self._stop.set()

    def hurry_stop(self) -> None:
        self.ctrl.hurry = True

    def resume_point(self, weights_only: bool = False) -> ResumePoint:
        return self.ctrl.resume_point(weights_only=weights_only)

    def resume(self, weights_only: bool = False) -> ResumePoint:
        """Relaunch from the newest complete checkpoint (RunLiveError while it runs)."""
        if self.following:
            raise RunLiveError(f"{self.run.run_id} is running: stop it before resuming")
        point = self.ctrl.resume_point(weights_only=weights_only)
        self.ctrl.launch(resume=point.spec, weights_only=weights_only)
        return point

    def describe(self) -> tuple[str, ...]:
        a = self.ctrl.attempt
        return tuple(self.ctrl.backend.describe(a)) if a is not None else ()

    def detach(self) -> None:
        self._detach.set()

    def close(self) -> None:
        """Stop watching and release the run (nothing of the run itself is stopped)."""
        self._detach.set()
        if self.monitor is not None:
            assert self.watch is not None  # started with the monitor
            self.watch.stop()
            self.monitor = None
        # the follow loop leaves at its next callback (within ~2 s); the lock goes with it
        with self._following:
            self.ctrl.close()
