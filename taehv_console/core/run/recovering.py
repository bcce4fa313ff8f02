"""The run controller's recovery: judge a failed attempt with core/run/recovery.py's pure
decision, then carry it out (a backoff, a relaunch from the newest verified checkpoint, the time
lost recorded), end a stall past its bound, keep the run supervised, and tell a person.

A part of RunController (core/run/control.py), kept apart so the decisions' plumbing reads on its
own; it uses the controller's state and primitives, declared in parts.py.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from taehv_console.core.cluster.preflight import first_free_port, port_free
from taehv_console.core.cluster.ssh import SshError, is_unreachable
from taehv_console.core.models import BackendKind
from taehv_console.core.run.backends import SrunBackend
from taehv_console.core.run.excluding import ExcludeError, ExcludeMixin
from taehv_console.core.run.outcome import ControlError, RunSnapshot, judge_pending, whoami
from taehv_console.core.run.parts import ControllerParts
from taehv_console.core.run.recovery import (
    Action,
    Cause,
    CauseKind,
    PastAttempt,
    Stall,
    classify,
    decide,
    stall_bound_s,
)
from taehv_console.core.run.state import Attempt, Failure, Phase, StopRecord
from trainer import checkpoint as ckpt

# How long a relaunch waits for the run's rendezvous port to be free on node 0 before it moves to
# another: a process of the failed attempt may hold it while it exits.
PORT_WAIT_S = 10.0


class RecoveryMixin(ExcludeMixin, ControllerParts):
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
            at = f" in {st.where}" if st.where else ""
            failure = Failure(
                reason=f"rank {st.rank} stalled for {st.stalled_s:.0f} s (the bound is {bound:.0f} s){at}; "
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

    def judge_pending(self) -> bool:
        """The run failed and nobody judged the failure yet (outcome.judge_pending)."""
        return judge_pending(self.state)

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
        cause = self._with_hardware_evidence(classify(failure))
        trained = self._tail().progress.last_step_time
        if trained is not None or self._pending_recovery is None:
            # a relaunch that never trained (it could not start on a lost node) keeps the fault
            # of the attempt it was to recover: that is where the time lost counts from
            self._fault_time = trained or failure.detected
        # a blamed node that does not answer (asked again now) is left out at once: a relaunch onto
        # it could not start (a stalled rank's machine may have dropped off the network too)
        blamed = cause.node
        unreachable = {blamed} if blamed is not None and self._cannot_reach(blamed) else set()
        decision = decide(
            self.cfg.recovery,
            cause,
            added_checkpoint=(newest.step if newest else 0) > a.from_step,
            history=history,
            nodes=self.cfg.topology.nodes,
            can_exclude=self.can_exclude(),
            spares=len(self.free_spares()),
            unreachable=unreachable,
        )
        a = replace(
            a,
            reached_step=self._tail().progress.step,
            cause=cause.kind.value,
            decision=decision.action.value,
            why=decision.reason,
            blamed_node=cause.node,
            last_step_at=self._fault_time,
            detected=failure.detected,
        )
        self._save(self.state.with_attempt(a))
        if decision.action not in (Action.RESTART, Action.EXCLUDE):
            word = "gave up" if decision.action is Action.GIVE_UP else "not restarted"
            self._note(f"{word}: {decision.reason}")
            return False
        if (
            decision.action is Action.EXCLUDE
            and decision.node is not None
            and not self._exclude(decision.node, decision.reason)
        ):
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

    def _with_hardware_evidence(self, cause: Cause) -> Cause:
        """The cause, with the watch's evidence that a node's GPUs are bad (lost, uncorrectable
        ECC errors, fewer than at launch): that node is the one to blame, as a device fault, when
        the failure blamed it or blamed no node and only it has such evidence."""
        if self._hardware is None or cause.kind in (
            CauseKind.DISK_FULL,
            CauseKind.LAUNCH,
            CauseKind.PORT_IN_USE,
        ):
            return cause
        try:
            by_host = dict(self._hardware())
        except Exception as err:  # noqa: BLE001 - the watch's trouble never stops a recovery
            self._note(f"hardware evidence could not be read: {err}")
            return cause
        evidence = {i: by_host[h] for i, h in enumerate(self.state.hosts) if h in by_host}
        node = cause.node if cause.node in evidence else None
        if node is None and cause.node is None and len(evidence) == 1:
            node = next(iter(evidence))
        if node is None:
            return cause
        return Cause(
            kind=CauseKind.DEVICE,
            why=f"{cause.why}; hardware evidence on node {node}: {evidence[node]}",
            node=node,
        )

    def _exclude(self, node: int, why: str) -> bool:
        """Leave `node` out before the relaunch (core/run/excluding.py); False, with the run
        FAILED and the reason said, when it cannot be done."""
        host = self._host(node) or "?"
        try:
            record = self._leave_out(node, why)
        except ExcludeError as err:
            self._note(f"not restarted: {err}")
            a = self._launched()
            self._save(self.state.with_attempt(replace(a, decision=Action.END.value, why=f"{a.why}; {err}")))
            return False
        how = (
            f"spare {record.replaced_by} takes its place"
            if record.replaced_by
            else f"the run goes on with {record.nodes_after} node(s)"
            + (f" from {record.checkpoint} (universal)" if record.checkpoint else "")
        )
        text = f"node {node} ({host}) left out: {how}"
        self._note(text + "".join(f"\n  {c}" for c in record.changes))
        self.notifier.send(
            "node-excluded",
            self._event_text(f"{text}. {why}"),
            node=node,
            host=host,
            replaced_by=record.replaced_by,
            nodes=record.nodes_after,
        )
        return True

    def _cannot_reach(self, node: int) -> bool:
        """Whether `node` does not answer now: asked again after the failure, since a node that
        answers was only cut off for a while and is struck, not left out at once."""
        host = self._host(node)
        if host is None:
            return False
        if isinstance(self.backend, SrunBackend):
            # inside an allocation SLURM says; many clusters let no one ssh to a compute node
            return bool(self.backend.node_down(host))
        if self.kind is not BackendKind.SSH:
            return False  # the platform's or this machine's: nothing the console reaches over ssh
        try:
            self.pool.runner(host).run(["true"], timeout=self.pool.settings.connect_timeout_s + 5)
        except Exception as err:  # noqa: BLE001 - any failure to run `true` there means not reachable
            return is_unreachable(err)
        return False

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
                    by=(request or {}).get("by", whoami()),
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
        self._free_rendezvous_port()
        newest = ckpt.scan(self.run.checkpoints).newest
        pending = self._pending_recovery
        if pending is None or not failed or (failed.reached_step or 0) > failed.from_step:
            pending = failed  # else: a relaunch that never trained; the fault is its predecessor's
        self._pending_recovery = pending
        try:
            self.launch(resume="latest" if newest else None, restarted=newest.step if newest else 0)
        except ControlError as err:
            self._note(f"the restart could not be launched: {err}")
            if self.state.phase is Phase.RECOVERING:
                self._pending_recovery = None
                self._save(replace(self.state, phase=Phase.FAILED))
                return False
            failure = self.state.failure
            if failure is not None and failure.kind == "node-lost":
                return self._recover(on_update, should_stop)  # judge it: the node may be left out
            self._pending_recovery = None
            return False
        where = f"checkpoint step {newest.step}" if newest else "the start (no checkpoint verifies)"
        self._note(f"attempt {self.attempt.number if self.attempt else '?'} launched from {where}")
        on_update(self.snapshot())
        return True

    def _free_rendezvous_port(self) -> None:
        """Before a relaunch, the rendezvous port node 0 will listen on: where the console can ask
        node 0 (this machine, ssh), the run's port once it is free (a previous process may still
        hold it for a few seconds), else the next free one; under SLURM, whose nodes the console
        may not reach, the next port after one that an attempt found taken. A platform's pods all
        use the port the platform gave them: kept. A new port is written into every launch file."""
        port, new = self.state.master_port, None
        if self.cfg.topology.nodes < 2:
            return  # one node rendezvous on a port of its own choosing (accelerate's standalone)
        if self.kind in (BackendKind.LOCAL, BackendKind.SSH):
            host = (self._host(0) if self.kind is BackendKind.SSH else None) or "localhost"
            try:
                runner = self.pool.runner(host)
                deadline = time.time() + PORT_WAIT_S
                while (free := port_free(runner, port)) is False and time.time() < deadline:
                    time.sleep(1.0)
                if free is not False:
                    return  # free, or node 0 does not answer: the launch will say what it finds
                new = first_free_port(runner, port + 1)
            except (SshError, OSError) as err:
                self._note(f"the rendezvous port on node 0 ({host}) could not be checked: {err}")
                return
        elif self.kind.slurm and self.state.failure is not None and self.state.failure.kind == "port-in-use":
            new = port + 1 if port < 65535 else 1024
            host = self._host(0) or "node 0"
        if new is None:
            return
        self._note(f"the rendezvous port {port} is taken on node 0 ({host}): the relaunch uses port {new}")
        state = self._save(replace(self.state, master_port=new))
        hosts = state.hosts if len(state.hosts) == self.cfg.topology.nodes else ()
        self._rewrite(self.cfg, hosts, state.master_addr)  # with the state's new port

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
        self._save(
            self.state.with_attempt(
                replace(a, lost_s=round(lost, 1), redone_steps=redone, trained_at=progress.first_step_time)
            )
        )
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
