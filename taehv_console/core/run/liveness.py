"""The run controller's liveness: which of an attempt's launchers are alive on their nodes (adopting
launchers a killed console never recorded), which vanished without an exit status, and which nodes
do not answer; a node unreachable past a bound while the run makes no step is lost.

A part of RunController (core/run/control.py); it uses the controller's state and primitives,
declared in parts.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from taehv_console.core.cluster.ssh import is_unreachable
from taehv_console.core.models import BackendKind
from taehv_console.core.run.parts import ControllerParts
from taehv_console.core.run.state import Attempt, NodeLauncher

# how much earlier than this console's attempt another pod may have started its node and still be
# part of the same attempt (pods start in any order, their clocks differ a little)
PEER_START_MARGIN_S = 120.0
# A launcher whose tree is gone gets this long to have its exit status appear before it counts
# as vanished (the wrapper writes it the moment the launcher exits, on shared storage).
STATUS_LAG_S = 5.0


class LivenessMixin(ControllerParts):
    def processes(self) -> dict[int, tuple[int, ...] | Exception]:
        a = self._adopt() or self.attempt
        if a is None or (not a.nodes and not a.slurm_job):
            return {}
        out = self.backend.processes(self.run, a)
        self._record_refusals()
        return out

    def _record_refusals(self) -> dict[int, str]:
        """The recorded groups the backend would not list or signal, because nothing proved them
        the run's (node.identify): each said once, and kept in state.json's `attention` for a
        person, since the console sent them nothing. node -> why, for the caller."""
        refused = self.backend.take_refusals()
        new = [f"{why}; no signal sent" for _node, why in sorted(refused.items())]
        new = [line for line in dict.fromkeys(new) if line not in self.state.attention]
        if new:
            for line in new:
                self._note(line)
            self._save(replace(self.state, attention=self.state.attention + tuple(new)))
        return refused

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
                    # the wrapper's own record: the console that started it never wrote one
                    start_ticks=st.start_ticks,
                    boot_id=st.boot_id,
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

    def _update_vanished(self, now: float, exited: set[int], watched: Sequence[int]) -> None:
        """Ask the nodes for their trees; a node whose tree is gone and whose exit status has not
        appeared within STATUS_LAG_S vanished (its wrapper was killed, or the node was lost). A
        node that does not answer is noted as unreachable, from when it first did not."""
        self._last_liveness = now
        for node, pids in self.processes().items():
            if isinstance(pids, Exception):
                if node >= 0 and is_unreachable(pids):
                    since = self._unreachable.get(node, (now, ""))[0]
                    self._unreachable[node] = (since, _short(pids))
                continue
            self._unreachable.pop(node, None)
            if pids:
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

    def _lost_nodes(self, now: float) -> list[int]:
        """Nodes unreachable for recovery.node_lost_after_s while the run made no step for as long:
        their ranks are gone or cut off, and the others would wait on them until the collective
        timeout (hours on the presets). While steps go on, an unreachable node is only the
        console's SSH trouble: the run trains on."""
        bound = self.cfg.recovery.node_lost_after_s
        a = self.attempt
        last = max(self._tail().progress.last_step_time or 0.0, a.started if a else 0.0)
        if now - last < bound:
            return []
        return sorted(n for n, (since, _) in self._unreachable.items() if now - since >= bound)


def _short(err: Exception) -> str:
    """An error's first line, for a note about a node that did not answer."""
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__
