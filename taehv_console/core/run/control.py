"""Run control: launch (or resume) every node, follow the run to its end, stop it, and pick it up
again from another console or the run's supervisor.

One RunController per run per process, holding the run's lock for its whole life. The loop in
`follow` reads the shared run directory (node status files, events) every half second and asks
the nodes for their process trees every few seconds; it decides:
- every rank stopped with `done` -> DONE; a stop it was asked for -> stop() -> STOPPED;
- a launcher exiting non-zero, a rank's error, or a launcher vanishing -> FAILED, with the first
  failing node and rank (core/run/failure.py), and every other node stopped within seconds
  rather than at the collective timeout; then the recovery policy judges it and the controller
  may relaunch it (core/run/recovering.py).
Closing the console (or losing SSH) stops nothing: the launchers run detached, and the run's
supervisor takes over (core/run/supervision.py).

The parts: values and errors in outcome.py, run creation in create.py, the stop in stopping.py,
liveness (which launchers are alive, vanished or unreachable) in liveness.py, recovery in
recovering.py, leaving a node out in excluding.py, requests from other consoles in requests.py.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.run import supervision
from taehv_console.core.run.backends import BackendKind, LaunchBackend, make_backend
from taehv_console.core.run.failure import (
    NodeEvidence,
    attempt_log_text,
    choose_failure,
    parse_root_cause,
    port_in_use,
    tail_lines,
    write_failure_text,
)
from taehv_console.core.run.launching import LaunchMixin
from taehv_console.core.run.liveness import PEER_START_MARGIN_S, STATUS_LAG_S, LivenessMixin
from taehv_console.core.run.lock import RunBusyError, RunLock
from taehv_console.core.run.notify import Notifier
from taehv_console.core.run.outcome import (
    Outcome,
    RunSnapshot,
    outcome_of,
    stop_grace_s,
    stop_step,
    verdict,
    whoami,
)
from taehv_console.core.run.progress import AttemptEvents, RunProgress
from taehv_console.core.run.records import damaged_line
from taehv_console.core.run.recovering import RecoveryMixin
from taehv_console.core.run.recovery import Stall
from taehv_console.core.run.rundir import RunDir
from taehv_console.core.run.state import (
    Attempt,
    Failure,
    NodeStatus,
    Phase,
    RunState,
    StopRecord,
    check_node_status,
)
from taehv_console.core.run.stopping import StopMixin
from trainer.config import TrainConfig

if TYPE_CHECKING:  # 3.10 has no typing.Self
    from typing_extensions import Self


# After a failure the survivors are usually stuck in a collective with a dead peer: they will not
# checkpoint, so they get a short grace before SIGKILL (the bound is 30 s in all).
FAILURE_GRACE_S = 8.0
# Symptoms on the other ranks often arrive before the cause is reported; wait this long after the
# first sign of trouble so the cause is among the evidence.
FAILURE_SETTLE_S = 2.0
LIVENESS_EVERY_S = 5.0


class RunController(LaunchMixin, LivenessMixin, RecoveryMixin, StopMixin):
    """Controls one run from this console. Make it with `RunController.open` (takes the lock)."""

    def __init__(
        self,
        run: RunDir,
        backend: LaunchBackend,
        lock: RunLock,
        state: RunState,
        cfg: TrainConfig,
        pool: SshPool,
        writes_state: bool = True,
    ):
        self.run = run
        self.pool = pool  # the nodes' runners, for whoever watches the run beside the controller
        self.backend = backend
        self.lock = lock
        self.state = state
        self.cfg = cfg
        self.writes_state = writes_state
        self.grace_s = stop_grace_s(cfg)
        self._events: AttemptEvents | None = None
        self._notes: list[str] = []
        self._last_liveness = 0.0
        self._gone_since: dict[int, float] = {}
        self._vanished: dict[int, str] = {}
        self._status_damage: dict[
            int, str
        ] = {}  # node -> why its status file does not read ("" when it does)
        self._unreachable: dict[int, tuple[float, str]] = {}  # node -> (since, why), this attempt
        self._trouble_since: float | None = None
        self._killed: tuple[str, ...] = ()
        self._unsaved = False  # a state write failed (disk full): flush_state() retries it
        self._write_error: OSError | None = None
        # set from another thread (a second Ctrl-C): the stop in progress skips the rest of its grace
        self.hurry = False
        self.notifier = Notifier(cfg.notify, run.run_id, note=self._note)
        self._hardware: Callable[[], Mapping[str, str]] | None = None  # host -> evidence (watch)
        self._pending_recovery: Attempt | None = None  # the failed attempt a relaunch recovers
        self._fault_time: float | None = None
        self._closed = False

    # -- opening
    @classmethod
    def open(
        cls,
        run: RunDir,
        pool: SshPool,
        purpose: str = "control",
        lock_name: str | None = None,
        state: RunState | None = None,
        handover: bool = True,
    ) -> RunController:
        """Take the run's lock and read its state. The run's supervisor hands the lock over when
        asked (core/run/supervision.py; not with `handover=False`); another console holding it is
        a RunBusyError."""
        path = run.path / lock_name if lock_name else run.lock_path
        try:
            lock = RunLock(path, purpose).acquire()
        except RunBusyError as busy:
            if lock_name or purpose == supervision.PURPOSE or not handover:
                raise
            lock = supervision.request_handover(run, path, purpose, busy)
        try:
            state = state or run.read_state()
            cfg = run.load_config()
            backend = make_backend(state.backend, pool, cfg.topology.nodes)
        except BaseException:
            lock.release()
            raise
        return cls(run, backend, lock, state, cfg, pool, writes_state=lock_name is None)

    def close(self) -> None:
        """Write what is pending and release the run (idempotent: a state written after the lock
        went could overwrite whoever holds it now)."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush_state()
        finally:
            self.backend.close()
            self.lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state
    def _save(self, state: RunState) -> RunState:
        """Record `state`. A write that fails (a full disk, ENOSPC, above all) never stops the
        console from doing what comes next, stopping the nodes first of all: the state is kept in
        memory, said once, and written by the next save or flush_state() once space allows."""
        self.state = state
        if self.writes_state:
            self._unsaved = True
            self.flush_state()
        return self.state

    def flush_state(self) -> bool:
        """Write the state if a save is pending; True when state.json says what the console knows."""
        if not self._unsaved:
            return True
        try:
            self.state = self.run.write_state(self.state)
        except OSError as err:
            if self._write_error is None:
                self._note(
                    f"{write_failure_text(err, self.run.state_path)}: the run's state is kept in memory "
                    "and written when space allows"
                )
            self._write_error = err
            return False
        if self._write_error is not None:
            self._note(f"run state written to {self.run.state_path} again")
        self._unsaved, self._write_error = False, None
        return True

    def _note(self, text: str) -> None:
        self._notes.append(text)

    @property
    def attempt(self) -> Attempt | None:
        return self.state.attempt

    @property
    def kind(self) -> BackendKind:
        return self.state.backend

    @property
    def world_size(self) -> int:
        return self.cfg.topology.world_size

    def _tail(self) -> AttemptEvents:
        if self._events is None:
            a = self.attempt
            offsets = dict(a.event_offsets) if a else {}
            self._events = AttemptEvents(
                self.run.events, self.world_size, self.cfg.optim.max_steps, offsets, note=self._note
            )
        return self._events

    # -- between attempts
    def _reset_follow(self) -> None:
        """Forget what the loop knew of the previous attempt (a new one starts)."""
        self._events = None
        self._gone_since.clear()
        self._vanished.clear()
        self._unreachable.clear()
        self._trouble_since = None

    def _host(self, node: int) -> str | None:
        if 0 <= node < len(self.state.hosts):
            return self.state.hosts[node]
        return None

    # -- follow
    def snapshot(self, events: Sequence[Mapping[str, Any]] = ()) -> RunSnapshot:
        notes, self._notes = tuple(self._notes), []
        a = self.attempt
        return RunSnapshot(
            run_id=self.run.run_id,
            phase=self.state.phase,
            attempt=a.number if a else 0,
            progress=self._tail().progress.snapshot(),
            events=tuple(events),
            notes=notes,
            failure=self.state.failure,
        )

    def follow(
        self,
        on_update: Callable[[RunSnapshot], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        interval: float = 0.5,
        stalls: Callable[[], Sequence[Stall]] | None = None,
        hardware: Callable[[], Mapping[str, str]] | None = None,
    ) -> Outcome:
        """Watch the run until it ends; stop it when should_stop() turns true or another console
        asks (stop.request). A failed attempt is judged by the run's recovery policy and, where it
        says so, relaunched from the newest verified checkpoint; `stalls` (the watch's stalled
        ranks) lets a stall that outlasts the policy's bound end the attempt; `hardware` (the watch's
        host -> evidence that its GPUs are bad) names the node to leave out. Returns how it ended."""
        self._hardware = hardware
        on_update = on_update or (lambda _s: None)
        should_stop = should_stop or (lambda: False)
        if self.state.phase is Phase.RECOVERING and not self._relaunch(on_update, should_stop, 0.0):
            on_update(self.snapshot())  # a console died during a restart's backoff: restart now
            return self.outcome()
        if self.state.phase.ended and not (self.judge_pending() and self._recover(on_update, should_stop)):
            on_update(self.snapshot())
            return self.outcome()
        if self.state.phase is Phase.STOPPING and self.state.stop is not None:
            # a console died in the middle of a stop: finish it, with what is left of its grace
            left = self.state.stop.requested + self.state.stop.grace_s - time.time()
            self.stop(
                grace_s=max(5.0, left),
                reason=self.state.stop.reason,
                by=self.state.stop.by,
                on_update=on_update,
            )
            return self.outcome()
        last_push = 0.0
        while True:
            events = self._tail().poll()
            now = time.time()
            request = self._stop_request()
            if should_stop() or request is not None:
                grace = request.get("grace_s") if request else None
                by = request.get("by", "another console") if request else whoami()
                self._note(f"stop requested by {by}")
                on_update(self.snapshot(events))
                self.stop(
                    grace_s=grace, reason="request" if request else "signal", by=by, on_update=on_update
                )
                self.run.stop_request_path.unlink(missing_ok=True)
                return self.outcome()
            self.flush_state()
            ended = self._check(now) or self._check_stalls(stalls, now)
            self._check_recovered()
            if events or self._notes or ended or now - last_push >= 2.0:
                on_update(self.snapshot(events))
                last_push = now
            if ended:
                if self.state.phase is Phase.FAILED and self._recover(on_update, should_stop):
                    continue
                self._announce_end()
                return self.outcome()
            time.sleep(interval)

    def _launched(self) -> Attempt:
        """The current attempt, where only a launched run can be (failing, stopping, concluding)."""
        a = self.attempt
        assert a is not None, "the run has no attempt: it was never launched"
        return a

    def _stop_request(self) -> dict | None:
        """The stop another console asked for (requests.py writes it), or None. The file's being
        there is the request: a damaged one still stops the run, with only the fields that read
        as what they should be (who, a grace in seconds, hurry)."""
        path = self.run.stop_request_path
        if not path.exists():
            return None
        try:
            request = json.loads(path.read_bytes().decode("utf-8") or "{}")
        except (OSError, ValueError, RecursionError):  # gone, binary, not JSON
            return {}
        if not isinstance(request, dict):
            return {}
        out: dict[str, Any] = {}
        if isinstance(request.get("by"), str):
            out["by"] = request["by"]
        grace = request.get("grace_s")
        if (
            isinstance(grace, (int, float))
            and not isinstance(grace, bool)
            and math.isfinite(grace)
            and grace >= 0
        ):
            out["grace_s"] = float(grace)
        if isinstance(request.get("hurry"), bool):
            out["hurry"] = request["hurry"]
        return out

    def _statuses(self) -> dict[int, NodeStatus]:
        """Status files of this attempt, per node. A node another console started (a platform's
        other pods) numbers its attempts on its own: its file counts when it was started after
        this attempt began (minus a margin for clocks and start order)."""
        a = self.attempt
        out: dict[int, NodeStatus] = {}
        if a is None:
            return out
        for i in range(self.cfg.topology.nodes):
            path = self.run.node_status_path(i)
            st, damaged = check_node_status(path)
            if damaged and self._status_damage.get(i) != damaged:
                # said once while it stays so: the node's exit is then seen from its processes
                self._note(damaged_line(str(path), None, damaged))
            self._status_damage[i] = damaged
            if st is None:
                continue
            mine = i in self.state.controlled or self.kind.slurm
            if (st.attempt == a.number) if mine else (st.started >= a.started - PEER_START_MARGIN_S):
                out[i] = st
        return out

    def _check(self, now: float) -> bool:
        """One round of decisions; True when the run has ended (state written)."""
        a = self.attempt
        if a is None:
            return True
        progress = self._tail().progress
        statuses = self._statuses()
        watched = self._watched_nodes()
        exited = {i for i, st in statuses.items() if st.exited}
        failing = {i: st.exit_code for i, st in statuses.items() if st.exited and st.exit_code != 0}
        if self.kind is BackendKind.SBATCH and not self.live_nodes():
            code = self.backend.job_exit_code(a)
            if code is not None:
                exited = set(watched)
                if code:
                    failing = {-1: code}
        rank_failed = self._failed_ranks(progress)
        reported = self._watched_ranks() <= set(progress.stops)

        # Every rank has said how it ended: that is the run's verdict, whatever the launchers exit
        # with (torchrun exits non-zero when it was itself signalled, even after a clean stop).
        if reported and not rank_failed:
            last_stop = max((e.get("time", now) for e in progress.stops.values()), default=now)
            if set(watched) <= exited or now - last_stop > STATUS_LAG_S:
                return self._conclude(progress)
            # Not a failure either, whatever a launcher exits with meanwhile: a platform pod sees
            # the other pods' launchers exit 1 after a clean stop (torchrun signalled), and its
            # own launcher still in torchrun's exit barrier; it concludes once that has exited.
            return False

        if now - self._last_liveness >= LIVENESS_EVERY_S or (failing and self._trouble_since is None):
            self._update_vanished(now, exited, watched)

        lost = self._lost_nodes(now)
        if failing or rank_failed or self._vanished or lost:
            if self._trouble_since is None:
                self._trouble_since = now
            if now - self._trouble_since < FAILURE_SETTLE_S and not set(watched) <= exited:
                return False  # let the cause be reported too, not only its symptoms
            if now - self._last_liveness > 1.0:
                self._update_vanished(now, exited, watched)  # which nodes answer, as of now
            self._fail(self._diagnose(statuses, progress, sorted(self._vanished.items()), failing, now))
            return True

        if watched and set(watched) <= exited:
            # Every launcher exited 0, yet some rank has not said how it ended. Its last words may
            # just be late: rank 0 finalizes a checkpoint after the others have written theirs and
            # left, and shared storage shows a file to other nodes with a delay.
            last_exit = max((statuses[i].ended or now for i in watched if i in statuses), default=now)
            if now - last_exit < STATUS_LAG_S:
                return False
            return self._conclude(progress)
        return False

    def _watched_ranks(self) -> set[int]:
        """The ranks whose `stop` decides this console's verdict: those of the nodes it watches
        (a platform's pod other than node 0 answers for its own node only)."""
        per = self.cfg.topology.gpus_per_node
        return {n * per + i for n in self._watched_nodes() if n >= 0 for i in range(per)}

    @staticmethod
    def _failed_ranks(progress: RunProgress) -> set[int]:
        return {r for r, e in progress.stops.items() if e.get("reason") == "error"} | set(progress.errors)

    def _watched_nodes(self) -> tuple[int, ...]:
        # nodes whose exit status this console expects: its own; on the platform's node 0, all
        # (the other pods write theirs to the shared run directory too)
        if self.kind is BackendKind.PLATFORM and 0 in self.state.controlled:
            return tuple(range(self.cfg.topology.nodes))
        if self.kind.slurm:
            return tuple(range(self.cfg.topology.nodes))
        return tuple(self.state.controlled)

    def _diagnose(
        self,
        statuses: Mapping[int, NodeStatus],
        progress: RunProgress,
        vanished: Sequence[tuple[int, str]],
        failing: Mapping[int, int | None],
        now: float,
    ) -> Failure:
        a = self.attempt
        evidence = []
        for i in range(self.cfg.topology.nodes):
            st = statuses.get(i)
            text = attempt_log_text(self.run.node_log(i), i, a.number if a else 1)
            evidence.append(
                NodeEvidence(
                    node=i,
                    host=self._host(i) or (st.hostname if st else "?"),
                    exit_code=st.exit_code if st else None,
                    ended=st.ended if st else None,
                    root_cause=parse_root_cause(text),
                    log_tail=tail_lines(text),
                    port_taken=port_in_use(text),
                )
            )
        errors = dict(progress.errors)
        for r, e in progress.stops.items():
            if e.get("reason") == "error" and r not in errors:
                errors[r] = {"message": "stopped with an error", "time": e.get("time", now)}
        unreachable = [(n, self._unreachable[n][1]) for n in sorted(self._unreachable)]
        failure = choose_failure(
            evidence, errors, self.cfg.topology.gpus_per_node, now, vanished, unreachable
        )
        if failure is None and -1 in failing:
            failure = Failure(
                reason=f"the SLURM job ended with exit code {failing[-1]}",
                exit_code=failing[-1],
                detected=now,
            )
        return failure or Failure(
            reason="the run failed, and no node left a reason the console could find", detected=now
        )

    def _fail(self, failure: Failure) -> None:
        """Record the failure, then stop every node still running: SIGTERM, a short grace, SIGKILL."""
        self._save(replace(self.state, phase=Phase.FAILED, failure=failure))
        self._note(f"failed: {failure.summary()}")
        a = self._launched()
        live = [n for n in self.live_nodes() if n in self.state.controlled or n < 0]
        if live:
            self._note(f"stopping node(s) {', '.join(map(str, live))} after the failure")
            self.backend.terminate(self.run, a, live)
            self._record_refusals()
            self._wait_gone(FAILURE_GRACE_S)
            left = self._kill_leftovers()
            if left:
                self._note(f"processes still listed after SIGKILL: {left}")
        self._save(self.state.with_attempt(replace(self._launched(), ended=time.time(), outcome="failed")))

    def _conclude(self, progress: RunProgress) -> bool:
        """Every launcher is done (or every rank said how it ended): record the verdict."""
        a = self._launched()
        # the launchers exit on their own right after the ranks' last words: give them the time
        # a clean exit takes before anything is killed
        left = {} if self._wait_gone(STATUS_LAG_S) else self._kill_leftovers()
        ranks = self._watched_ranks()
        stops = {r: e for r, e in progress.stops.items() if r in ranks}
        phase = verdict(stops, ranks, stop_requested=False)
        if phase is Phase.STOPPED and self.state.stop is None:
            # stopped from outside the console (a signal to the launchers)
            self.state = replace(
                self.state,
                stop=StopRecord(
                    requested=min(e.get("time", 0) for e in stops.values()),
                    by="outside the console",
                    reason="signal",
                    grace_s=0,
                    checkpoint_step=self._verified_checkpoint(stop_step(stops, ranks)),
                    verified=not left,
                    finished=time.time(),
                ),
            )
        elif phase is Phase.FAILED:
            failure = self._diagnose(self._statuses(), progress, (), {}, time.time())
            self._save(replace(self.state, failure=failure))
        self._save(
            replace(self.state.with_attempt(replace(a, ended=time.time(), outcome=phase.value)), phase=phase)
        )
        self._note(f"run {phase.value}")
        return True

    def outcome(self) -> Outcome:
        return outcome_of(self.run, self.state, self._tail().progress.snapshot())

    # -- attach
    def reconcile(self) -> str:
        """After a console died: 'live' when the current attempt still has processes (the state
        says running again), else the attempt is concluded from what it left: 'ended'."""
        a = self.attempt
        if a is None or a.ended is not None:
            return "ended"
        if self.is_live():
            if self.state.phase not in (Phase.RUNNING, Phase.STOPPING):
                self._save(replace(self.state, phase=Phase.RUNNING))
            return "live"
        self._tail().poll()
        progress = self._tail().progress
        statuses = self._statuses()
        watched = self._watched_nodes()
        clean = all(i in statuses and statuses[i].exit_code == 0 for i in watched)
        if (self._watched_ranks() <= set(progress.stops) and not self._failed_ranks(progress)) or clean:
            self._conclude(progress)
        else:
            failing = {i: st.exit_code for i, st in statuses.items() if st.exited and st.exit_code != 0}
            vanished = [
                (i, self._host(i) or "?") for i in watched if i not in statuses or not statuses[i].exited
            ]
            self._fail(self._diagnose(statuses, progress, vanished, failing, time.time()))
        return "ended"
