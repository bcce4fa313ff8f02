"""A console as a client of the run's supervisor (core/run/supervision.py): it follows the run from
state.json, the ranks' events and the supervisor's log, never holds the run's lock, and asks for a
stop through RUN/stop.request (a second Ctrl-C rewrites it with `hurry`). Whatever the run needs
while nobody watches is the supervisor's, so a console's window, terminal or SSH session can go at
any moment and nothing of the run goes with it.

A console launches or resumes the run itself (the lock held for the launch only, so its errors are
the console's to show), then hands it to the supervisor (`RunClient.hand_over`). Should the
supervisor be gone while the run goes on, the client starts another, which adopts the run.

Consoles follow this way wherever a supervisor keeps the run (`client_mode`); with
TAEHV_SUPERVISOR=off, or in a platform pod (the platform restarts that console), the console
controls the run itself (control.py).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.models import BackendKind
from taehv_console.core.run import supervision
from taehv_console.core.run.backends import make_backend
from taehv_console.core.run.outcome import ControlError, Outcome, RunSnapshot, outcome_of, settled
from taehv_console.core.run.progress import AttemptEvents
from taehv_console.core.run.requests import write_stop_request
from taehv_console.core.run.rundir import RunDir
from taehv_console.core.run.state import Phase, RunState, StateError
from trainer.config import ConfigError, TrainConfig

if TYPE_CHECKING:
    from taehv_console.core.run.control import RunController

# how often the client checks that the run's supervisor is alive
KEEP_EVERY_S = 2.0
# supervisors a client starts for one run before it says the supervisor keeps exiting
RESPAWNS = 3
# a supervisor's log line: its time, then the note
_STAMP = re.compile(r"^(?:\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d (.*)$")


def client_mode(kind: BackendKind) -> bool:
    """Whether a console follows a run of this backend as its supervisor's client."""
    return supervision.enabled() and supervision.supervised(kind)


def supervised_client(run: RunDir, pool: SshPool) -> RunClient | None:
    """A client for `run` when its supervisor is alive and consoles are its clients (no lock
    taken); None when the console should open the run itself."""
    if not supervision.enabled() or supervision.running_supervisor(run) is None:
        return None
    try:
        client = RunClient(run, pool)
    except (StateError, ConfigError, OSError):
        return None  # opening the run the usual way says what is wrong with it
    return client if client_mode(client.kind) else None


class RunClient:
    """Follows one run that its supervisor controls. Make it with `hand_over` after a launch or a
    resume, or `supervised_client` for a run already supervised."""

    def __init__(self, run: RunDir, pool: SshPool, grace_s: float | None = None):
        self.run = run
        self.pool = pool
        self.state: RunState = run.read_state()
        self.cfg: TrainConfig = run.load_config()
        # sent with a stop request; None: the supervisor's (the run config's schedule.stop_grace_s)
        self.grace_s = grace_s
        self._events: AttemptEvents | None = None
        self._events_of = self._attempt_number()
        self._notes: list[str] = []
        self._log_at = self._log_size()
        self._log_rest = b""
        self._spawned = 0
        self._last_keep = 0.0

    @classmethod
    def hand_over(cls, ctrl: RunController) -> RunClient:
        """After this console launched, resumed or adopted the run under its lock: start the run's
        supervisor (unless one runs), release the lock (the supervisor takes it within half a
        second), and follow the run as the supervisor's client from here on."""
        grace = ctrl.grace_s
        pid = supervision.spawn_supervisor(ctrl.run, supervision.ssh_env(ctrl.pool.settings))
        ctrl.close()
        client = cls(ctrl.run, ctrl.pool, grace_s=grace)
        client._note(
            f"the run's supervisor (pid {pid}) controls it; this console follows it, and quitting "
            f"leaves it supervised (log: {supervision.log_path(ctrl.run)})"
        )
        return client

    # -- reading
    @property
    def kind(self) -> BackendKind:
        return self.state.backend

    @property
    def phase(self) -> Phase:
        return self.state.phase

    def _attempt_number(self) -> int:
        a = self.state.attempt
        return a.number if a else 0

    def _tail(self) -> AttemptEvents:
        if self._events is None:
            a = self.state.attempt
            offsets = dict(a.event_offsets) if a else {}
            self._events = AttemptEvents(
                self.run.events,
                self.cfg.topology.world_size,
                self.cfg.optim.max_steps,
                offsets,
                note=self._note,
            )
        return self._events

    def refresh(self) -> list[dict[str, Any]]:
        """Read state.json again, and the events new since the last call. A new attempt (a restart,
        a node left out) starts its own events, and maybe its own config."""
        try:
            self.state = self.run.read_state()
        except StateError as err:
            self._note(f"state.json could not be read ({err}); showing what was read before")
        number = self._attempt_number()
        if number != self._events_of:
            self._events_of, self._events = number, None
            self.cfg = self.run.load_config()
        return self._tail().poll()

    def snapshot(self, events: Sequence[dict[str, Any]] = ()) -> RunSnapshot:
        notes, self._notes = tuple(self._notes), []
        return RunSnapshot(
            run_id=self.run.run_id,
            phase=self.state.phase,
            attempt=self._attempt_number(),
            progress=self._tail().progress.snapshot(),
            events=tuple(events),
            notes=notes,
            failure=self.state.failure,
        )

    def outcome(self) -> Outcome:
        return outcome_of(self.run, self.state, self._tail().progress.snapshot())

    def settled(self) -> bool:
        return settled(self.state)

    def describe(self) -> list[str]:
        a = self.state.attempt
        if a is None:
            return []
        backend = make_backend(self.kind, self.pool, self.cfg.topology.nodes)
        try:
            return list(backend.describe(a))
        finally:
            backend.close()

    # -- the supervisor
    def _note(self, text: str) -> None:
        self._notes.append(text)

    def _log_size(self) -> int:
        try:
            return supervision.log_path(self.run).stat().st_size
        except OSError:
            return 0

    def _read_log(self) -> None:
        """The supervisor's notes written since the last call become this console's notes."""
        try:
            with open(supervision.log_path(self.run), "rb") as f:
                f.seek(self._log_at)
                data = f.read(1 << 20)
        except OSError:
            return
        self._log_at += len(data)
        *lines, self._log_rest = (self._log_rest + data).split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").rstrip()
            m = _STAMP.match(line)
            if m is not None:
                self._note(m.group(1))
            elif line and self._notes:
                self._notes[-1] += "\n" + line  # a multi-line note
            elif line:
                self._note(line)

    def keep_supervised(self) -> None:
        """Start a supervisor when the run goes on and none is alive (it died, or was killed): the
        new one adopts the run. ControlError when the ones started keep exiting."""
        if self.settled() or supervision.running_supervisor(self.run) is not None:
            return
        if self._spawned >= RESPAWNS:
            raise ControlError(
                f"{self.run.run_id}: the run's supervisor exited {self._spawned} times while the run "
                f"is {self.state.phase.value}; see {supervision.log_path(self.run)}, then "
                f"`taehv-console supervise {self.run.path}`"
            )
        pid = supervision.spawn_supervisor(self.run, supervision.ssh_env(self.pool.settings))
        self._spawned += 1
        self._note(f"the run's supervisor was gone: started another (pid {pid}), which adopts the run")

    def request_stop(self, hurry: bool = False) -> None:
        write_stop_request(self.run, self.grace_s, hurry=hurry)

    # -- following
    def follow(
        self,
        on_update: Callable[[RunSnapshot], None],
        should_stop: Callable[[], bool] | None = None,
        hurry: Callable[[], bool] | None = None,
        interval: float = 0.5,
    ) -> Outcome:
        """Render the run until it has ended for good (a failure whose restart is decided has
        not); ask the supervisor to stop it once should_stop() turns true, and to hurry once
        hurry() does."""
        should_stop = should_stop or (lambda: False)
        hurry = hurry or (lambda: False)
        asked = hurried = False
        last_push = 0.0
        while True:
            events = self.refresh()
            now = time.time()
            if not asked and should_stop() and not self.settled():
                self.request_stop()
                asked = True
                self._note("stop asked of the run's supervisor")
            if asked and not hurried and hurry():
                self.request_stop(hurry=True)
                hurried = True
            if now - self._last_keep >= KEEP_EVERY_S:
                self._last_keep = now
                self.keep_supervised()
            self._read_log()
            done = self.settled()
            if events or self._notes or done or now - last_push >= 2.0:
                on_update(self.snapshot(events))
                last_push = now
            if done:
                return self.outcome()
            time.sleep(interval)
