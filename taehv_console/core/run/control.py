"""Run control: create a run, launch (or resume) every node, follow it to its end, stop it, and
pick it up again from another console.

One RunController per run per console, holding the run's lock for its whole life. The loop in
`follow` reads the shared run directory (node status files, events) every half second and asks
the nodes for their process trees every few seconds; it decides:
- every rank stopped with `done` -> DONE; a stop it was asked for -> stop() -> STOPPED;
- a launcher exiting non-zero, a rank's error, or a launcher vanishing -> FAILED, with the first
  failing node and rank (core/run/failure.py), and every other node stopped within seconds
  rather than at the collective timeout.
Closing the console (or losing SSH) stops nothing: the launchers run detached.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from taehv_console.core.plan.render import RenderOptions, launch_command, launch_env, write_launch_files
from taehv_console.core.run import supervision
from taehv_console.core.run.backends import (
    BackendError,
    BackendKind,
    LaunchBackend,
    NodeCommand,
    make_backend,
)
from taehv_console.core.run.failure import (
    NodeEvidence,
    attempt_log_text,
    choose_failure,
    parse_root_cause,
    tail_lines,
    write_failure_text,
)
from taehv_console.core.run.lock import RunBusyError, RunLock
from taehv_console.core.run.notify import Notifier
from taehv_console.core.run.progress import AttemptEvents, file_sizes
from taehv_console.core.run.recovery import (
    Action,
    CauseKind,
    PastAttempt,
    Stall,
    classify,
    decide,
    stall_bound_s,
)
from taehv_console.core.run.rundir import RunDir, create_run_dir
from taehv_console.core.run.state import Attempt, Failure, NodeLauncher, Phase, RunState, StopRecord
from trainer import checkpoint as ckpt

if TYPE_CHECKING:  # 3.10 has no typing.Self
    from typing_extensions import Self

DEFAULT_GRACE_S = 120.0
# After a failure the survivors are usually stuck in a collective with a dead peer: they will not
# checkpoint, so they get a short grace before SIGKILL (the bound is 30 s in all).
FAILURE_GRACE_S = 8.0
# Symptoms on the other ranks often arrive before the cause is reported; wait this long after the
# first sign of trouble so the cause is among the evidence.
FAILURE_SETTLE_S = 2.0
LIVENESS_EVERY_S = 5.0
# how much earlier than this console's attempt another pod may have started its node and still be
# part of the same attempt (pods start in any order, their clocks differ a little)
PEER_START_MARGIN_S = 120.0
# A launcher whose tree is gone gets this long to have its exit status appear before it counts
# as vanished (the wrapper writes it the moment the launcher exits, on shared storage).
STATUS_LAG_S = 5.0


class ControlError(RuntimeError):
    """A control action cannot be done; the message says why and what to do instead."""


class RunLiveError(ControlError):
    """The run's processes are alive: a launch or resume would start it twice."""


class NothingToResumeError(ControlError):
    pass


class WorldSizeChangedError(ControlError):
    pass


class LaunchError(ControlError):
    pass


def stop_grace_s(cfg: Any) -> float:
    """The preset's stop grace when the schema has one (schedule.stop_grace_s), else 120 s."""
    value = getattr(getattr(cfg, "schedule", None), "stop_grace_s", None)
    return float(value) if value else DEFAULT_GRACE_S


def _me() -> str:
    return f"{os.getpid()}@{socket.gethostname()}"


# ------------------------------------------------------------------------------------- verdict


def verdict(stops: Mapping[int, Mapping[str, Any]], watched: Iterable[int], stop_requested: bool) -> Phase:
    """How an attempt ended, from the `stop` events its watched ranks wrote (rank -> event) and
    whether this console asked it to stop. Every rank said `done`: DONE (even mid-stop: it finished
    first); any rank stopped with an error: FAILED; every rank stopped, or a stop was asked: STOPPED;
    otherwise some rank ended without a word: FAILED."""
    watched = set(watched)
    mine = {r: e for r, e in stops.items() if r in watched}
    reported = watched <= set(mine)
    reasons = {str(e.get("reason")) for e in mine.values()}
    if reported and reasons == {"done"}:
        return Phase.DONE
    if "error" in reasons:
        return Phase.FAILED
    if reported or stop_requested:
        return Phase.STOPPED
    return Phase.FAILED


def stop_step(stops: Mapping[int, Mapping[str, Any]], watched: Iterable[int]) -> int | None:
    """The step every watched rank stopped (and checkpointed) at; None unless they all said and agree."""
    watched = set(watched)
    mine = [e for r, e in stops.items() if r in watched]
    if not watched <= set(stops) or {str(e.get("reason")) for e in mine} - {"signal", "done"}:
        return None
    steps = {e.get("step") for e in mine}
    return steps.pop() if len(steps) == 1 else None


# ------------------------------------------------------------------------------------ creation


@dataclass(frozen=True)
class LaunchSpec:
    """Where and how the run's nodes start. `hosts` in machine-rank order (the ssh aliases for the
    ssh backend); `controlled` the nodes this console starts (all, except on a platform)."""

    backend: BackendKind
    hosts: tuple[str, ...]
    master_addr: str
    master_port: int
    env: Mapping[str, str] = field(default_factory=dict)
    controlled: tuple[int, ...] | None = None


def create_run(runs_dir: str | Path, cfg: Any, spec: LaunchSpec, run: RunDir | None = None) -> RunDir:
    """Write a new run directory (or fill a given one): run.toml, the rendered launch files with
    the real hosts and master, and state.json in phase `created`."""
    run = run or create_run_dir(runs_dir, cfg.run.preset)
    run.logs.mkdir(parents=True, exist_ok=True)
    nodes = cfg.topology.nodes
    hosts = spec.hosts if len(spec.hosts) == nodes else ()
    write_launch_files(
        cfg,
        run.path,
        RenderOptions(
            run_dir=str(run.path),
            hosts=hosts,
            main_process_ip=spec.master_addr,
            main_process_port=spec.master_port,
        ),
    )
    controlled = spec.controlled if spec.controlled is not None else tuple(range(nodes))
    state = RunState(
        run_id=run.run_id,
        phase=Phase.CREATED,
        backend=spec.backend,
        hosts=tuple(spec.hosts),
        master_addr=spec.master_addr,
        master_port=spec.master_port,
        created=time.time(),
        env=tuple(sorted(spec.env.items())),
        controlled=controlled,
    )
    run.write_state(state)
    return run


# ------------------------------------------------------------------------------------ snapshots


@dataclass(frozen=True)
class RunSnapshot:
    """What a front end shows: phase, attempt, progress numbers, the events new since the last
    snapshot, and console notes (stop sent, node killed ...)."""

    run_id: str
    phase: Phase
    attempt: int
    progress: Mapping[str, Any]
    events: tuple[Mapping[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    failure: Failure | None = None


@dataclass(frozen=True)
class Outcome:
    phase: Phase
    failure: Failure | None
    stop: StopRecord | None
    progress: Mapping[str, Any]
    final_weights: str | None = None
    # failed in a way another try would repeat, or the console's restarts gave up: do not requeue
    final: bool = False


@dataclass(frozen=True)
class ResumePoint:
    spec: str  # "latest" or a checkpoint path, as taehv-train takes it
    step: int
    path: str
    world_size: int | None
    skipped: tuple[str, ...] = ()


# ----------------------------------------------------------------------------------- controller


class RunController:
    """Controls one run from this console. Make it with `RunController.open` (takes the lock)."""

    def __init__(
        self,
        run: RunDir,
        backend: LaunchBackend,
        lock: RunLock,
        state: RunState,
        cfg: Any,
        writes_state: bool = True,
        pool: Any = None,
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
        self._trouble_since: float | None = None
        self._killed: tuple[str, ...] = ()
        self._unsaved = False  # a state write failed (disk full): flush_state() retries it
        self._write_error: OSError | None = None
        # set from another thread (a second Ctrl-C): the stop in progress skips the rest of its grace
        self.hurry = False
        self.notifier = Notifier(cfg.notify, run.run_id, note=self._note)
        self._pending_recovery: Attempt | None = None  # the failed attempt a relaunch recovers
        self._fault_time: float | None = None

    # -- opening
    @classmethod
    def open(
        cls,
        run: RunDir,
        pool: Any,
        purpose: str = "control",
        lock_name: str | None = None,
        state: RunState | None = None,
    ) -> RunController:
        """Take the run's lock and read its state. The run's supervisor hands the lock over when
        asked (core/run/supervision.py); another console holding it is a RunBusyError."""
        path = run.path / lock_name if lock_name else run.lock_path
        try:
            lock = RunLock(path, purpose).acquire()
        except RunBusyError as busy:
            if lock_name or purpose == supervision.PURPOSE:
                raise
            lock = supervision.request_handover(run, path, purpose, busy)
        try:
            state = state or run.read_state()
            cfg = run.load_config()
            backend = make_backend(state.backend, pool, cfg.topology.nodes)
        except BaseException:
            lock.release()
            raise
        return cls(run, backend, lock, state, cfg, writes_state=lock_name is None, pool=pool)

    def close(self) -> None:
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
            self._events = AttemptEvents(self.run.events, self.world_size, self.cfg.optim.max_steps, offsets)
        return self._events

    # -- liveness
    def processes(self) -> dict[int, tuple[int, ...] | Exception]:
        a = self._adopt() or self.attempt
        if a is None or (not a.nodes and not a.slurm_job):
            return {}
        return self.backend.processes(self.run, a)

    def _adopt(self) -> Attempt | None:
        """An attempt whose launchers were started but never recorded (the console was killed in
        between) takes them over from their wrappers' status files (pid, pgid, start time), so it
        is seen as live: never marked failed while it trains, never launched a second time."""
        a = self.attempt
        if a is None or a.ended is not None or a.nodes or a.slurm_job or self.kind.slurm:
            return None
        found = []
        for i in self.state.controlled:
            st = self.run.node_status(i)
            if st is None or st.attempt != a.number or st.started < a.started - PEER_START_MARGIN_S:
                continue
            host = self._host(i) or "localhost"
            found.append(
                NodeLauncher(
                    index=i,
                    host=host,
                    pid=st.pid,
                    pgid=st.pgid,
                    log=str(self.run.node_log(i)),
                    started=st.started,
                )
            )
        if not found:
            return None
        self._note(
            "adopted node launcher(s) "
            + ", ".join(f"{n.index} (pgid {n.pgid})" for n in found)
            + " from their status files: the console that started them never recorded them"
        )
        return self._save(self.state.with_attempt(replace(a, nodes=tuple(found)))).attempt

    def live_nodes(self) -> dict[int, tuple[int, ...]]:
        """node -> live pids for nodes with anything left; an unreachable node counts as live
        (better refuse a launch than start a run twice)."""
        out = {}
        for node, pids in self.processes().items():
            if isinstance(pids, Exception) or pids:
                out[node] = () if isinstance(pids, Exception) else pids
        return out

    def is_live(self) -> bool:
        a = self.attempt
        return a is not None and a.ended is None and bool(self.live_nodes())

    # -- launch
    def commands(self, attempt: int, resume: str | None, weights_only: bool) -> list[NodeCommand]:
        cfg = self.cfg
        env = {
            **launch_env(cfg),
            # torchrun gives its ranks this long after forwarding SIGTERM before it SIGKILLs them;
            # its default of 30 s would cut a checkpoint short of our own grace period
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(int(self.grace_s)),
            **dict(self.state.env),
        }
        hosts = self.state.hosts or ("localhost",) * cfg.topology.nodes
        out = []
        for i in self.state.controlled:
            argv = launch_command(cfg, i, RenderOptions(run_dir=str(self.run.path)))
            if resume:
                argv += ["--resume", resume] + (["--weights-only"] if weights_only else [])
            out.append(
                NodeCommand(
                    index=i,
                    host=hosts[i] if i < len(hosts) else "localhost",
                    argv=tuple(argv),
                    env=env,
                    log=str(self.run.node_log(i)),
                    status=str(self.run.node_status_path(i)),
                    cwd=str(self.run.path),
                )
            )
        return out

    def launch(
        self, resume: str | None = None, weights_only: bool = False, restarted: int | None = None
    ) -> RunState:
        """Start every controlled node's launcher (a resume when `resume` is given). Refuses a run
        whose processes are alive. On a node that cannot be started, the others are killed."""
        a = self.attempt
        if a is not None and a.ended is None:
            live = self.live_nodes()
            if live:
                raise RunLiveError(
                    f"{self.run.run_id} is running (node(s) {', '.join(map(str, sorted(live)))} "
                    "alive): a second launch would start it twice; attach to it instead "
                    f"(taehv-console attach {self.run.run_id})"
                )
            self.reconcile()  # the last attempt ended without a console: record how, before the next
            a = self.attempt
        number = (a.number if a else 0) + 1
        for i in self.state.controlled:
            self.run.node_status_path(i).unlink(
                missing_ok=True
            )  # a stale status is never read as this attempt's
        self.run.stop_request_path.unlink(missing_ok=True)
        attempt = Attempt(
            number=number,
            started=time.time(),
            resume=resume,
            weights_only=weights_only,
            event_offsets=tuple(sorted(file_sizes(self.run.events).items())),
            from_step=restarted if restarted is not None else self._resume_step(resume),
            restarted_by="recovery" if restarted is not None else "",
            restart_budget=self.cfg.recovery.max_restarts,
        )
        self._save(replace(self.state.with_attempt(attempt), phase=Phase.LAUNCHING, failure=None, stop=None))
        self._events = None
        self._gone_since.clear()
        self._vanished.clear()
        self._trouble_since = None
        started = self.backend.start(self.run, self.commands(number, resume, weights_only), number)
        attempt = replace(attempt, nodes=started.launchers, slurm_job=started.slurm_job)
        self._save(self.state.with_attempt(attempt))
        if started.errors:
            node, why = min(started.errors.items())
            failure = Failure(
                reason=f"could not start the launcher: {why}",
                node=node if node >= 0 else None,
                host=self._host(node),
                detected=time.time(),
                kind="launch",
            )
            if started.launchers:
                self.backend.kill(self.run, attempt)
            self._save(
                replace(
                    self.state.with_attempt(replace(attempt, ended=time.time(), outcome="failed")),
                    phase=Phase.FAILED,
                    failure=failure,
                )
            )
            raise LaunchError(failure.summary())
        if restarted is None:
            self.notifier.send("launched", self._event_text(f"attempt {number} launched"), attempt=number)
        return self._save(replace(self.state, phase=Phase.RUNNING))

    def _resume_step(self, resume: str | None) -> int:
        """The step a launch starts from: 0 fresh, else its checkpoint's."""
        if not resume:
            return 0
        st = ckpt.scan(self.run.checkpoints).newest if resume == "latest" else ckpt.verify(Path(resume))
        return st.step if st is not None and st.ok else 0

    def _host(self, node: int) -> str | None:
        if 0 <= node < len(self.state.hosts):
            return self.state.hosts[node]
        return None

    # -- resume
    def resume_point(self, weights_only: bool = False, from_path: str | None = None) -> ResumePoint:
        """The checkpoint a resume starts from (newest complete one, or `from_path`), checked against
        this run's world size before anything starts."""
        if from_path:
            st = ckpt.verify(Path(from_path))
            if not st.ok:
                raise NothingToResumeError(
                    f"{from_path}: not a complete checkpoint ({st.state}: {'; '.join(st.problems)})"
                )
            skipped: tuple[str, ...] = ()
            spec = str(Path(from_path).absolute())
        else:
            scan = ckpt.scan(self.run.checkpoints)
            skipped = tuple(f"{s.path.name}: {'; '.join(s.problems)}" for s in scan.skipped)
            if scan.newest is None:
                extra = f" (skipped: {'; '.join(skipped)})" if skipped else ""
                raise NothingToResumeError(
                    f"{self.run.run_id}: no complete checkpoint in {self.run.checkpoints}"
                    f"{extra}; start a new run instead"
                )
            st = scan.newest
            spec = "latest"
        if st.step >= self.cfg.optim.max_steps and self.run.final_weights.is_file():
            raise NothingToResumeError(
                f"{self.run.run_id} finished at step {st.step} of {self.cfg.optim.max_steps}; "
                f"its weights are in {self.run.final_weights.parent}"
            )
        world = self.world_size
        if (
            st.world_size is not None
            and st.world_size != world
            and not weights_only
            and ckpt.universal_problem(st.path) is not None
        ):  # a converted one loads at any world size
            t = self.cfg.topology
            raise WorldSizeChangedError(
                f"{self.run.run_id}: {st.path.name} was written by {st.world_size} processes, but run.toml now has "
                f"{t.nodes} node(s) x {t.gpus_per_node} = {world}. ZeRO optimizer shards cannot be loaded at another "
                "world size, so the console will not try. Two supported paths:\n"
                f"  1. weights only, with a fresh optimizer:  taehv-console resume {self.run.run_id} --weights-only\n"
                "  2. DeepSpeed's universal checkpoint (keeps the optimizer state): convert once, then resume:\n"
                f"     {shlex.join(ckpt.universal_command(st.path))}\n"
                f"     taehv-console resume {self.run.run_id}"
            )
        return ResumePoint(
            spec=spec, step=st.step, path=str(st.path), world_size=st.world_size, skipped=skipped
        )

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
    ) -> Outcome:
        """Watch the run until it ends; stop it when should_stop() turns true or another console
        asks (stop.request). A failed attempt is judged by the run's recovery policy and, where it
        says so, relaunched from the newest verified checkpoint; `stalls` (the watch's stalled
        ranks) lets a stall that outlasts the policy's bound end the attempt. Returns how it ended."""
        on_update = on_update or (lambda _s: None)
        should_stop = should_stop or (lambda: False)
        self._ensure_supervisor()
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
                by = request.get("by", "another console") if request else _me()
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

    # -- recovery: judge a failed attempt (core/run/recovery.py), then carry the decision out
    def _check_stalls(self, stalls: Callable[[], Sequence[Stall]] | None, now: float) -> bool:
        """End the attempt when a rank has been stalled past the policy's bound (and its forensics
        are in, or a minute more has passed): the collective timeout would end it hours later."""
        a = self.attempt
        if stalls is None or self.state.phase is not Phase.RUNNING or a is None:
            return False
        for st in stalls():
            if now - st.stalled_s < a.started:
                continue  # a heartbeat left by an earlier attempt: this one's rank has not beaten yet
            bound = stall_bound_s(self.cfg.recovery, st.step_time_s)
            if st.stalled_s < bound or (not st.forensics and st.stalled_s < bound + 60):
                continue
            per = max(1, self.cfg.topology.gpus_per_node)
            node = st.rank // per
            failure = Failure(
                reason=f"rank {st.rank} stalled for {st.stalled_s:.0f} s (the bound is {bound:.0f} s); "
                "its stack is in the forensics report",
                node=node,
                host=self._host(node) or st.node,
                rank=st.rank,
                local_rank=st.rank % per,
                detected=now,
                kind="stall",
            )
            self.notifier.send("stalled", self._event_text(failure.summary()), rank=st.rank, node=node)
            self._fail(failure)
            return True
        return False

    def _ensure_supervisor(self) -> None:
        """Whoever follows a run makes sure it stays supervised after them: the run's supervisor
        waits in standby while this console holds the lock and takes over when it goes."""
        if self.lock.purpose == supervision.PURPOSE or not supervision.supervised(self.kind):
            return
        if self.state.phase.ended and not self.judge_pending():
            return
        pid = supervision.spawn_supervisor(self.run)
        if pid is not None:
            self._note(
                f"supervisor pid {pid} keeps the run supervised when this console closes "
                f"(log: {supervision.log_path(self.run)})"
            )

    def _launched(self) -> Attempt:
        """The current attempt, where only a launched run can be (failing, stopping, concluding)."""
        a = self.attempt
        assert a is not None, "the run has no attempt: it was never launched"
        return a

    def judge_pending(self) -> bool:
        """The run failed and nobody judged the failure yet: it failed while no console or
        supervisor followed it, and whoever adopts it decides now."""
        a = self.attempt
        return (
            self.state.phase is Phase.FAILED
            and a is not None
            and not a.decision
            and self.state.failure is not None
        )

    def _restart_chain(self) -> list[Attempt]:
        """The attempts since a person last started the run (a launch or a resume): the current
        one and those the console relaunched before it."""
        chain: list[Attempt] = []
        for a in reversed(self.state.attempts):
            chain.append(a)
            if a.restarted_by != "recovery":
                break
        return chain[::-1]

    def _recover(self, on_update: Callable[[RunSnapshot], None], should_stop: Callable[[], bool]) -> bool:
        """Judge the attempt that just failed and act: relaunch after a backoff (True: a new
        attempt runs), or end the run FAILED (final when the failure would repeat or the budget
        is spent)."""
        a, failure = self.attempt, self.state.failure
        if a is None or failure is None:
            return False
        newest = ckpt.scan(self.run.checkpoints).newest
        chain = self._restart_chain()
        # each earlier failure in the chain was restarted; it added a checkpoint when the next
        # attempt started from a newer one
        history = [
            PastAttempt(CauseKind.parse(p.cause), p.blamed_node, nxt.from_step > p.from_step)
            for p, nxt in itertools.pairwise(chain)
        ]
        cause = classify(failure)
        self._fault_time = self._tail().progress.last_step_time or failure.detected
        decision = decide(
            self.cfg.recovery,
            cause,
            added_checkpoint=(newest.step if newest else 0) > a.from_step,
            history=history,
            nodes=self.cfg.topology.nodes,
            can_exclude=False,
        )
        a = replace(
            a,
            reached_step=self._tail().progress.step,
            cause=cause.kind.value,
            decision=decision.action.value,
            why=decision.reason,
            blamed_node=cause.node,
        )
        self._save(self.state.with_attempt(a))
        if decision.action is not Action.RESTART:  # EXCLUDE needs can_exclude, which no backend has yet
            word = "gave up" if decision.action is Action.GIVE_UP else "not restarted"
            self._note(f"{word}: {decision.reason}")
            return False
        self._note(
            f"restarting (restart {decision.restart} of {decision.of}) in {decision.delay_s:g} s: {decision.reason}"
        )
        self.notifier.send(
            "restarting",
            self._event_text(
                f"restart {decision.restart} of {decision.of} in {decision.delay_s:g} s after {cause.why}"
            ),
            restart=decision.restart,
            of=decision.of,
            cause=cause.kind.value,
            node=cause.node,
        )
        self._save(replace(self.state, phase=Phase.RECOVERING))
        on_update(self.snapshot())
        return self._relaunch(on_update, should_stop, decision.delay_s)

    def _relaunch(
        self, on_update: Callable[[RunSnapshot], None], should_stop: Callable[[], bool], delay_s: float
    ) -> bool:
        """After `delay_s` (a stop asked meanwhile cancels it: the run ends STOPPED at its newest
        checkpoint), launch a new attempt from the newest verified checkpoint (fresh without one)."""
        failed = self.attempt
        deadline = time.time() + delay_s
        while time.time() < deadline:
            request = self._stop_request()
            if should_stop() or request is not None:
                self.run.stop_request_path.unlink(missing_ok=True)
                newest = ckpt.scan(self.run.checkpoints).newest
                record = StopRecord(
                    requested=time.time(),
                    by=(request or {}).get("by", _me()),
                    reason="request",
                    grace_s=0,
                    checkpoint_step=newest.step if newest else None,
                    verified=not self.live_nodes(),
                    finished=time.time(),
                )
                self._note("the restart is cancelled: a stop was asked during its backoff")
                self._save(replace(self.state, phase=Phase.STOPPED, stop=record))
                return False
            time.sleep(0.25)
        newest = ckpt.scan(self.run.checkpoints).newest
        self._pending_recovery = failed
        try:
            self.launch(resume="latest" if newest else None, restarted=newest.step if newest else 0)
        except ControlError as err:
            self._pending_recovery = None
            self._note(f"the restart could not be launched: {err}")
            if self.state.phase is Phase.RECOVERING:
                self._save(replace(self.state, phase=Phase.FAILED))
            return False
        where = f"checkpoint step {newest.step}" if newest else "the start (no checkpoint verifies)"
        self._note(f"attempt {self.attempt.number if self.attempt else '?'} launched from {where}")
        on_update(self.snapshot())
        return True

    def _check_recovered(self) -> None:
        """Once the relaunched attempt trains again: how long the failure cost (fault to first step)
        and how many steps it redoes, recorded on the attempt, said, and sent."""
        failed, a = self._pending_recovery, self.attempt
        progress = self._tail().progress
        if failed is None or a is None or progress.first_step_time is None:
            return
        self._pending_recovery = None
        # the failed attempt's last step bounds the fault from below: lost_s errs long, never short
        fault = self._fault_time or failed.ended or progress.first_step_time
        lost = max(0.0, progress.first_step_time - fault)
        redone = max(0, (failed.reached_step or 0) - a.from_step)
        self._save(self.state.with_attempt(replace(a, lost_s=round(lost, 1), redone_steps=redone)))
        text = f"recovered: training again {lost:.0f} s after the fault, {redone} step(s) redone"
        self._note(text)
        self.notifier.send("recovered", self._event_text(text), lost_s=round(lost, 1), redone_steps=redone)

    def _announce_end(self) -> None:
        phase, a = self.state.phase, self.attempt
        if phase is Phase.DONE:
            weights = self.run.final_weights
            self.notifier.send("done", self._event_text(f"done; weights in {weights}"), weights=str(weights))
        elif phase is Phase.FAILED and a is not None:
            kind = "gave-up" if a.decision == Action.GIVE_UP.value else "failed"
            why = a.why or (self.state.failure.summary() if self.state.failure else "failed")
            self.notifier.send(kind, self._event_text(why), cause=a.cause)

    def _event_text(self, text: str) -> str:
        return f"taehv run {self.run.run_id}: {text}"

    def _stop_request(self) -> dict | None:
        path = self.run.stop_request_path
        if not path.exists():
            return None
        try:
            return json.loads(path.read_text() or "{}")
        except (OSError, json.JSONDecodeError):
            return {}

    def _statuses(self) -> dict[int, Any]:
        """Status files of this attempt, per node. A node another console started (a platform's
        other pods) numbers its attempts on its own: its file counts when it was started after
        this attempt began (minus a margin for clocks and start order)."""
        a = self.attempt
        out: dict[int, Any] = {}
        if a is None:
            return out
        for i in range(self.cfg.topology.nodes):
            st = self.run.node_status(i)
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

        if now - self._last_liveness >= LIVENESS_EVERY_S or (failing and self._trouble_since is None):
            self._update_vanished(now, exited, watched)

        if failing or rank_failed or self._vanished:
            if self._trouble_since is None:
                self._trouble_since = now
            if now - self._trouble_since < FAILURE_SETTLE_S and not set(watched) <= exited:
                return False  # let the cause be reported too, not only its symptoms
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
    def _failed_ranks(progress: Any) -> set[int]:
        return {r for r, e in progress.stops.items() if e.get("reason") == "error"} | set(progress.errors)

    def _update_vanished(self, now: float, exited: set[int], watched: Sequence[int]) -> None:
        """Ask the nodes for their trees; a node whose tree is gone and whose exit status has not
        appeared within STATUS_LAG_S vanished (its wrapper was killed, or the node was lost)."""
        self._last_liveness = now
        for node, pids in self.processes().items():
            if isinstance(pids, Exception) or pids:
                self._gone_since.pop(node, None)
                self._vanished.pop(node, None)
                continue
            first = self._gone_since.setdefault(node, now)
            if now - first < STATUS_LAG_S:
                continue
            if node >= 0 and node not in exited:
                self._vanished[node] = self._host(node) or "?"
            elif node < 0 and self.kind is BackendKind.SLURM and not set(watched) <= exited:
                self._vanished[node] = "srun"

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
        statuses: Mapping[int, Any],
        progress: Any,
        vanished: Sequence[tuple[int, str]],
        failing: Mapping[int, int],
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
                )
            )
        errors = dict(progress.errors)
        for r, e in progress.stops.items():
            if e.get("reason") == "error" and r not in errors:
                errors[r] = {"message": "stopped with an error", "time": e.get("time", now)}
        failure = choose_failure(evidence, errors, self.cfg.topology.gpus_per_node, now, vanished)
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
            self._wait_gone(FAILURE_GRACE_S)
            left = self._kill_leftovers()
            if left:
                self._note(f"processes still listed after SIGKILL: {left}")
        self._save(self.state.with_attempt(replace(self._launched(), ended=time.time(), outcome="failed")))

    def _wait_gone(self, seconds: float, on_update: Callable[[RunSnapshot], None] | None = None) -> bool:
        deadline = time.time() + seconds
        next_check = 0.0
        while True:
            events = self._tail().poll()
            if on_update and events:
                on_update(self.snapshot(events))
            now = time.time()
            if now >= next_check:
                if not self.live_nodes():
                    return True
                next_check = now + 1.0
            if now >= deadline or self.hurry:
                return False
            time.sleep(0.25)

    def _kill_leftovers(self) -> dict[int, tuple[int, ...]]:
        """SIGKILL every tree with anything left; node -> what is still there after that."""
        live = self.live_nodes()
        if not live:
            return {}
        self._note("SIGKILL to what is left on node(s) " + ", ".join(map(str, sorted(live))))
        self._killed = tuple(f"{self._host(n) or 'local'}:{self._pgid(n)}" for n in sorted(live))
        out = self.backend.kill(self.run, self._launched(), sorted(live))
        left = {n: v for n, v in out.items() if isinstance(v, tuple) and v}
        return left

    def _pgid(self, node: int) -> int | None:
        a = self.attempt
        return next((n.pgid for n in a.nodes if n.index == node), None) if a else None

    # -- stop
    def stop(
        self,
        grace_s: float | None = None,
        reason: str = "user",
        by: str | None = None,
        on_update: Callable[[RunSnapshot], None] | None = None,
    ) -> StopRecord:
        """SIGTERM every node's launcher group, wait for the ranks' checkpoint and `stop` events
        (up to the grace period), SIGKILL what is left, then check that nothing of those process
        trees remains on any node."""
        a = self.attempt
        grace = float(grace_s) if grace_s is not None else self.grace_s
        record = StopRecord(requested=time.time(), by=by or _me(), reason=reason, grace_s=grace)
        if a is None or a.ended is not None:
            return self.state.stop or record
        self._killed = ()
        self._save(replace(self.state, phase=Phase.STOPPING, stop=record))
        errors = self.backend.terminate(self.run, a)
        for node, why in errors.items():
            self._note(f"node {node}: SIGTERM not delivered: {why}")
        self._note(
            f"SIGTERM sent to {len(a.nodes) or 1} launcher group(s); up to {grace:g} s for the checkpoint"
        )
        if on_update:
            on_update(self.snapshot())
        self._wait_gone(grace, on_update)
        left = self._kill_leftovers()
        verified = not left and not self.live_nodes()
        stops = self._await_stops(STATUS_LAG_S)
        ranks = self._watched_ranks()
        step = self._verified_checkpoint(stop_step(stops, ranks))
        record = replace(
            record, checkpoint_step=step, killed=self._killed, verified=verified, finished=time.time()
        )
        phase = verdict(stops, ranks, stop_requested=True)
        if phase is Phase.FAILED:  # a rank failed on the way out: say which and why
            self._save(
                replace(
                    self.state,
                    failure=self._diagnose(self._statuses(), self._tail().progress, (), {}, time.time()),
                )
            )
        self._save(
            replace(
                self.state.with_attempt(replace(a, ended=time.time(), outcome=phase.value)),
                phase=phase,
                stop=record,
            )
        )
        where = f"checkpoint at step {step}" if step is not None else "no checkpoint from this stop"
        self._note(
            f"{phase.value}: {where}; " + ("nothing left running" if verified else f"still listed: {left}")
        )
        if on_update:
            on_update(self.snapshot())
        return record

    def _verified_checkpoint(self, claimed: int | None) -> int | None:
        """The checkpoint a stop left, as the checkpoint directory proves (manifest, sizes, archive
        directories), not as the ranks' stop events claim: a save that failed on a full disk still
        ends in a `stop` naming its step."""
        if claimed is None:
            return None
        st = ckpt.verify(self.run.checkpoints / f"step-{claimed}")
        if st.ok:
            return claimed
        newest = ckpt.scan(self.run.checkpoints).newest
        self._note(
            f"the ranks stopped at step {claimed}, but checkpoints/step-{claimed} does not verify "
            f"({'; '.join(st.problems[:2]) or st.state}); newest verified checkpoint: "
            + (f"step {newest.step}" if newest else "none")
        )
        return newest.step if newest else None

    def _await_stops(self, seconds: float) -> dict[int, Mapping[str, Any]]:
        """The watched ranks' `stop` events, waiting up to `seconds` for the ones not read yet (a
        node's last lines reach shared storage a moment after its processes are gone)."""
        ranks = self._watched_ranks()
        deadline = time.time() + seconds
        while True:
            self._tail().poll()
            stops: dict[int, Mapping[str, Any]] = {
                r: e for r, e in self._tail().progress.stops.items() if r in ranks
            }
            if ranks <= set(stops) or time.time() >= deadline:
                return stops
            time.sleep(0.2)

    def _conclude(self, progress: Any) -> bool:
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
        a = self.attempt
        return Outcome(
            phase=self.state.phase,
            failure=self.state.failure,
            stop=self.state.stop,
            progress=self._tail().progress.snapshot(),
            final_weights=str(self.run.final_weights) if self.run.final_weights.is_file() else None,
            final=self.state.phase is Phase.FAILED
            and a is not None
            and a.decision in (Action.FAIL.value, Action.GIVE_UP.value),
        )

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


# ------------------------------------------------------------------------------------ requests


def request_stop(
    run: RunDir,
    pool: Any,
    grace_s: float | None = None,
    wait_s: float | None = None,
    on_update: Callable[[RunSnapshot], None] | None = None,
    say: Callable[[str], None] | None = None,
) -> RunState:
    """Stop a run from any console. If no console controls it, take the lock and stop it here;
    if one does, ask it (stop.request) and wait until the state says the run ended; should that
    console die meanwhile, take over."""
    say = say or (lambda _m: None)
    deadline = None
    while True:
        try:
            ctrl = RunController.open(run, pool, purpose="stop")
        except RunBusyError as err:
            if deadline is None:
                grace = grace_s if grace_s is not None else stop_grace_s(run.load_config())
                deadline = time.time() + (wait_s if wait_s is not None else grace + 90)
                tmp = run.stop_request_path.with_name(f".{run.stop_request_path.name}.{os.getpid()}")
                tmp.write_text(json.dumps({"time": time.time(), "by": _me(), "grace_s": grace_s}))
                os.replace(tmp, run.stop_request_path)
                say(f"{err}\nasked it to stop the run; waiting for it")
            state = run.read_state()
            if state.phase.ended:
                return state
            if time.time() > deadline:
                raise ControlError(
                    f"{run.run_id}: the controlling console did not stop the run in time "
                    f"(state: {state.phase.value})"
                ) from None
            time.sleep(0.5)
            continue
        with ctrl:
            if ctrl.reconcile() == "ended":
                return ctrl.state
            say(f"stopping {run.run_id}")
            ctrl.stop(grace_s=grace_s, reason="user", on_update=on_update)
            run.stop_request_path.unlink(missing_ok=True)
            return ctrl.state


def probe_live(run: RunDir, pool: Any) -> tuple[RunState, dict[int, tuple[int, ...] | Exception]]:
    """State and live process trees of a run, without taking its lock (for `status`)."""
    state = run.read_state()
    a = state.attempt
    if a is None or a.ended is not None:
        return state, {}
    cfg = run.load_config()
    backend = make_backend(state.backend, pool, cfg.topology.nodes)
    try:
        return state, backend.processes(run, a)
    except BackendError as err:
        return state, {-1: err}
