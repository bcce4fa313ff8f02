"""The supervisor's loop (`taehv-console supervise RUN`): wait for the run's lock in standby, then
control the run as a console would (the run controller with recovery, the watch with stall
forensics), and let go when a console asks for the run; exit once the run has ended.

The protocol (lock, handover request, files) is in core/run/supervision.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.run import supervision
from taehv_console.core.run.control import RunController
from taehv_console.core.run.lock import RunBusyError
from taehv_console.core.run.outcome import Outcome, RunSnapshot
from taehv_console.core.run.rundir import RunDir
from taehv_console.core.run.state import Phase, StateError
from taehv_console.core.watch.runwatch import RunWatch

POLL_S = 0.5
# a handover request older than this was left by a console that died while asking
STALE_REQUEST_S = supervision.HANDOVER_WAIT_S + 15


class _HandedOver(Exception):
    """Raised from the follow loop's update when a console asked for the run."""


@dataclass
class Supervisor:
    run: RunDir
    pool: SshPool
    say: Callable[[str], None]
    # tests put fake launchers in: called on every controller the supervisor opens
    prepare: Callable[[RunController], None] | None = None

    def serve(self) -> Outcome | None:
        """Supervise until the run has ended (its Outcome), or until the run directory is gone
        (None)."""
        supervision.write_info(self.run)
        self.say(f"supervising {self.run.run_id}")
        while True:
            if not self.run.path.is_dir():
                self.say("the run directory is gone: nothing to supervise")
                return None
            ctrl = self._take()
            if ctrl is None:
                time.sleep(POLL_S)
                continue
            try:
                outcome = self._control(ctrl)
            finally:
                ctrl.close()
            if outcome is not None:
                return outcome
            self._wait_for_taker()

    def _take(self) -> RunController | None:
        """The run's controller when the lock is free and no console is asking for it."""
        if self._requested():
            return None
        try:
            ctrl = RunController.open(self.run, self.pool, purpose=supervision.PURPOSE)
        except RunBusyError:
            return None
        except StateError as err:
            self.say(f"cannot read the run's state: {err}")
            return None
        if self.prepare is not None:
            self.prepare(ctrl)
        return ctrl

    def _control(self, ctrl: RunController) -> Outcome | None:
        """Adopt the run and follow it: its Outcome once it ended, None after a handover."""
        state = ctrl.state
        if state.phase.ended and not ctrl.judge_pending():
            self.say(f"{self.run.run_id} has ended ({state.phase.value}): nothing to supervise")
            return ctrl.outcome()
        if state.phase not in (Phase.RECOVERING,) and not state.phase.ended:
            how = ctrl.reconcile()
            self.say(f"took control of {self.run.run_id} ({how})")
        watch = RunWatch.for_controller(ctrl).start()

        def update(snap: RunSnapshot) -> None:
            for note in snap.notes:
                self.say(note)
            # let go between rounds, never in the middle of a stop or a restart
            if snap.phase is Phase.RUNNING and self._requested():
                raise _HandedOver

        try:
            outcome = ctrl.follow(update, stalls=watch.stalls, hardware=watch.hardware)
        except _HandedOver:
            self.say("a console asked for the run: handing it over, back to standby")
            return None
        finally:
            watch.stop()
        self.say(f"{self.run.run_id} ended: {outcome.phase.value}")
        return outcome

    def _requested(self) -> bool:
        path = supervision.handover_path(self.run)
        try:
            age = time.time() - path.stat().st_mtime
        except OSError:
            return False
        if age > STALE_REQUEST_S:
            path.unlink(missing_ok=True)
            return False
        return True

    def _wait_for_taker(self) -> None:
        """After letting go: stay off the lock while the request stands (the asking console
        removes it once it holds the lock)."""
        deadline = time.time() + STALE_REQUEST_S
        while self._requested() and time.time() < deadline:
            time.sleep(0.1)
