"""The run controller's stop: SIGTERM every node's launcher group, wait for the ranks' checkpoint
and `stop` events up to the grace period, SIGKILL what is left, check that nothing of the run's
process trees remains, and record the verified checkpoint it left.

A part of RunController (core/run/control.py); it uses the controller's state and primitives,
declared in parts.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from taehv_console.core.run.outcome import RunSnapshot, stop_step, verdict, whoami
from taehv_console.core.run.parts import ControllerParts
from taehv_console.core.run.state import Phase, StopRecord
from trainer import checkpoint as ckpt

# A node's last `stop` lines reach shared storage a moment after its processes are gone.
STOP_EVENTS_LAG_S = 5.0


class StopMixin(ControllerParts):
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
            if now >= deadline or self._hurried():
                return False
            time.sleep(0.25)

    def _hurried(self) -> bool:
        """A second Ctrl-C here (`hurry`), or in a console that asked for this stop (stop.request
        rewritten with `hurry`): the stop skips the rest of its grace."""
        return self.hurry or bool((self._stop_request() or {}).get("hurry"))

    def _kill_leftovers(self) -> dict[int, tuple[int, ...]]:
        """SIGKILL every tree with anything left; node -> what is still there after that."""
        live = self.live_nodes()
        if not live:
            return {}
        self._note("SIGKILL to what is left on node(s) " + ", ".join(map(str, sorted(live))))
        out = self.backend.kill(self.run, self._launched(), sorted(live))
        refused = self._record_refusals()
        self._killed = tuple(
            f"{self._host(n) or 'local'}:{self._pgid(n)}" for n in sorted(live) if n not in refused
        )
        left = {n: v for n, v in out.items() if isinstance(v, tuple) and v}
        return left

    def _pgid(self, node: int) -> int | None:
        a = self.attempt
        return next((n.pgid for n in a.nodes if n.index == node), None) if a else None

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
        record = StopRecord(requested=time.time(), by=by or whoami(), reason=reason, grace_s=grace)
        if a is None or a.ended is not None:
            return self.state.stop or record
        self._killed = ()
        self._save(replace(self.state, phase=Phase.STOPPING, stop=record))
        errors = self.backend.terminate(self.run, a)
        refused = self._record_refusals()  # noted there, with the pid and why
        for node, why in errors.items():
            if node not in refused:
                self._note(f"node {node}: SIGTERM not delivered: {why}")
        sent = (len(a.nodes) or 1) - len(errors)
        self._note(
            f"SIGTERM sent to {sent} launcher group(s); up to {grace:g} s for the checkpoint"
            if sent
            else "no SIGTERM sent: no launcher group could be signalled"
        )
        if on_update:
            on_update(self.snapshot())
        self._wait_gone(grace, on_update)
        left = self._kill_leftovers()
        verified = not left and not self.live_nodes()
        stops = self._await_stops(STOP_EVENTS_LAG_S)
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
