"""From what was ingested to the one RunView every front end renders: rank and node health, the
run's phase (one vocabulary), progress and ETA (one formula), histories, and notices for every
health transition (a stall is named once, when it starts).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from taehv_console.core.watch.health import (
    AssessMemo,
    HealthPolicy,
    assess_node,
    assess_ranks,
    watchdog_counts,
)
from taehv_console.core.watch.ingest import Ingest, get
from taehv_console.core.watch.state import (
    CollectiveStall,
    Histories,
    NodeSnapshot,
    NodeState,
    Notice,
    RankHealth,
    RankState,
    RunHeader,
    RunView,
    Series,
    SourceStatus,
)
from taehv_console.core.watch.tbscalars import HISTORY_TAGS, TensorBoardScalars
from trainer.flops import LOW_MFU

_QUIET = frozenset({"healthy", "starting", "ok", "unknown", "stopped"})
# the console's verdict wins once it has one: the processes are gone, the record says how
_CONSOLE_FINAL = {"done", "stopped", "failed", "stopping"}


def _moves(
    kind: str, current: Mapping[Any, Any], previous: Mapping[Any, Any]
) -> list[tuple[str, Any, Any, Any]]:
    """(kind, name, before, after) for each state that moved since the previous view; not a first
    sighting, nor a move between quiet states."""
    if current == previous:
        return []
    return [
        (kind, name, before, state)
        for name, state in current.items()
        if (before := previous.get(name)) is not None
        and before != state
        and not (before in _QUIET and state in _QUIET)
    ]


def run_phase(
    ranks: tuple[RankHealth, ...],
    stops: list[Any],
    collective: CollectiveStall | None,
    has_ranks: bool,
    has_steps: bool,
    console_phase: str | None,
) -> str:
    """waiting | starting | running | stalled | stopping | done | stopped | failed: what a run is
    doing, from its ranks' health and their `stop` reasons, and the console's record when it has
    concluded (state.json)."""
    if console_phase in _CONSOLE_FINAL:
        return console_phase
    states = [r.state for r in ranks]
    if not has_ranks:
        return "waiting"
    if states and all(s in (RankState.STOPPED, RankState.FAILED) for s in states):
        if RankState.FAILED in states or "error" in stops:
            return "failed"
        return "done" if stops and all(s == "done" for s in stops) else "stopped"
    if RankState.FAILED in states:
        return "failed"
    if collective is not None or RankState.STALLED in states:
        return "stalled"
    return "running" if has_steps else "starting"


def eta_s(step: int | None, max_steps: int | None, step_time_s: float | None) -> float | None:
    """Steps left times the median step time (one slow step is no trend)."""
    if max_steps is None or step is None or not step_time_s or step >= max_steps:
        return None
    return (max_steps - step) * step_time_s


class ViewBuilder:
    """Builds RunViews from an Ingest; remembers the previous health states to note transitions."""

    def __init__(
        self,
        ingest: Ingest,
        run_dir: str,
        run_id: str,
        policy: HealthPolicy,
        notices_len: int,
        facts: Mapping[str, Any] | None = None,
    ):
        self.ing = ingest
        self.run_dir = run_dir
        self.run_id = run_id
        self.policy = policy
        self.notices_len = notices_len
        self.facts = dict(facts or {})
        self.seq = 0
        self.memo = AssessMemo()
        # previous health states, to note transitions: rank -> state, node -> state, the collective's
        self._prev_ranks: dict[int, RankState] = {}
        self._prev_nodes: dict[str, NodeState] = {}
        self._prev_collective: str | None = None
        self._step_summary: tuple[int, tuple[float | None, bool, float | None]] | None = None

    def ranks(self, now: float) -> tuple[tuple[RankHealth, ...], CollectiveStall | None]:
        ing = self.ing
        timeout = get(ing.run_cfg, "distributed", "collective_timeout_s")
        return assess_ranks(
            ing.observations(self.policy.pause_grace_s, self.policy.straggler_window),
            self.policy,
            now,
            watchdog=watchdog_counts(ing.signals),
            collective_timeout_s=float(timeout) if timeout else None,
            memo=self.memo,
        )

    def build(
        self,
        now: float,
        *,
        agents_on: bool,
        tb: TensorBoardScalars | None = None,
        sources: tuple[SourceStatus, ...] = (),
    ) -> RunView:
        ing, pol = self.ing, self.policy
        ranks, collective = self.ranks(now)
        node_names = list(ing.hosts) + sorted({r.node for r in ranks} - set(ing.hosts))
        by_node: dict[str, list[RankHealth]] = {}
        for r in ranks:
            by_node.setdefault(r.node, []).append(r)
        nodes = []
        for name in node_names:
            a = ing.agents.get(name)
            node_ranks = by_node.get(name, [])
            sample = a.sample if a else None
            sample_age = (now - sample.received) if sample else None
            running_for = (now - a.first_open) if (a and a.first_open is not None) else None
            down = (
                a.status
                if (a and a.stream is None and a.status.startswith(("restarting", "no sample")))
                else ""
            )
            state, detail = assess_node(
                name,
                node_ranks,
                sample,
                sample_age,
                pol,
                agent_expected=agents_on and a is not None,
                agent_running_for_s=running_for,
                agent_down=down,
            )
            nodes.append(
                NodeSnapshot(
                    name=name,
                    state=state,
                    detail=detail,
                    sample=sample,
                    sample_age_s=round(sample_age, 2) if sample_age is not None else None,
                    ranks=tuple(r.rank for r in node_ranks),
                    clock_offset_s=round(a.offset, 4) if (a and a.offsets) else None,
                    agent=(a.status if a else "off") if agents_on else "off",
                    facts=self.facts.get(name),
                )
            )
        self._note_transitions(ranks, nodes, collective, now)
        notices = sorted([*ing.fold.notices, *ing.notices], key=lambda n: n.time)[-self.notices_len :]
        self.seq += 1
        return RunView(
            time=now,
            seq=self.seq,
            run=self._header(ranks, collective),
            nodes=tuple(nodes),
            ranks=ranks,
            collective=collective,
            checkpoints=ing.checkpoints,
            history=self._histories(tb),
            notices=tuple(notices),
            signals=tuple(ing.signals),
            scalars=tb.series() if tb else (),
            sources=sources,
            console=ing.console,
            forensics=tuple(sorted(ing.forensics.values(), key=lambda f: f.time or 0.0)),
            damaged=ing.damaged(),
        )

    def _header(self, ranks: tuple[RankHealth, ...], collective: CollectiveStall | None) -> RunHeader:
        ing = self.ing
        fold = ing.fold
        last = fold.last_step or {}
        step = ing.current_step()
        max_steps = ing.max_steps()
        median_step, any_steps, updated = self._steps_summary()
        step_time = median_step if median_step is not None else last.get("step_time_s")
        rank0 = fold.ranks.get(0)
        start0 = (rank0.start if rank0 else None) or {}
        stops = [e.stop.get("reason") for e in fold.ranks.values() if e.stop]
        console_phase = ing.console.phase.value if ing.console is not None else None
        phase = run_phase(
            ranks, stops, collective, bool(ranks or fold.ranks), any_steps or bool(last), console_phase
        )
        return RunHeader(
            run_dir=self.run_dir,
            run_id=self.run_id,
            phase=phase,
            console_phase=console_phase,
            step=step,
            max_steps=max_steps,
            world_size=ing.world_size(),
            preset=start0.get("preset") or get(ing.run_cfg, "run", "preset"),
            loss=last.get("loss"),
            psnr=last.get("psnr"),
            lr=last.get("lr"),
            clips_per_s=last.get("samples_per_s"),
            mfu=last.get("mfu"),
            step_time_s=step_time,
            eta_s=eta_s(step, max_steps, step_time) if phase in ("running", "stalled", "starting") else None,
            val_step=(fold.last_val or {}).get("step"),
            val_psnr=(fold.last_val or {}).get("psnr"),
            best_val_psnr=fold.best_val_psnr,
            started=fold.first_start,
            updated=updated,
            stop_reason=(rank0.stop or {}).get("reason") if rank0 else None,
            data_skipped=fold.data_skipped,
            nonfinite_skipped=int(last.get("nonfinite_skipped") or 0),
        )

    def _steps_summary(self) -> tuple[float | None, bool, float | None]:
        """(median of every rank's recent step times, whether any rank finished a step, the newest
        heartbeat or event time). The walk over every rank's heartbeat follows heartbeats only;
        events (rank 0's, ten a second) touch only the event side."""
        ing = self.ing
        if self._step_summary is None or self._step_summary[0] != ing.heartbeat_version:
            times = [t for tr in ing.ranks.values() for t in tr.step_times]
            newest = max([tr.hb_time for tr in ing.ranks.values() if tr.hb_time is not None], default=None)
            self._step_summary = (
                ing.heartbeat_version,
                (statistics.median(times) if times else None, bool(times), newest),
            )
        median, any_steps, newest = self._step_summary[1]
        updated = max(
            [t for t in (newest, *(e.last_time for e in ing.fold.ranks.values())) if t is not None],
            default=None,
        )
        return median, any_steps, updated

    def _histories(self, tb: TensorBoardScalars | None) -> Histories:
        ing = self.ing
        fold = ing.fold
        gpu = []
        for name, a in ing.agents.items():
            for idx in sorted(a.gpu_hist):
                series = a.gpu_series.get(idx)
                if series is None:
                    series = a.gpu_series[idx] = a.gpu_hist[idx].series(f"{name}/{idx}")
                gpu.append(series)
        if fold.loss or tb is None:
            return Histories(
                loss=Series("loss", tuple(fold.loss)),
                psnr=Series("psnr", tuple(fold.psnr)),
                lr=Series("lr", tuple(fold.lr)),
                val_psnr=Series("val_psnr", tuple(fold.val)),
                clips_per_s=Series("clips_per_s", tuple(fold.clips)),
                gpu_util=tuple(gpu),
            )

        by_tag = {s.name: s for s in tb.series()}
        kw = {
            field_: Series(field_, by_tag[tag].points)
            for tag, field_ in HISTORY_TAGS.items()
            if tag in by_tag
        }
        return Histories(**kw, gpu_util=tuple(gpu))

    def _note_transitions(
        self,
        ranks: tuple[RankHealth, ...],
        nodes: list[NodeSnapshot],
        collective: CollectiveStall | None,
        now: float,
    ) -> None:
        # States are str enums: compared and hashed as their values, turned into text only on a change.
        cur_ranks = {r.rank: r.state for r in ranks}
        cur_nodes = {n.name: n.state for n in nodes}
        changes = [*_moves("rank", cur_ranks, self._prev_ranks), *_moves("node", cur_nodes, self._prev_nodes)]
        coll = "stalled" if collective is not None else "ok"
        if self._prev_collective is not None and self._prev_collective != coll:
            changes.append(("collective", None, self._prev_collective, coll))
        for kind, name, before, after in changes:
            before, after = str(getattr(before, "value", before)), str(getattr(after, "value", after))
            if kind == "collective":
                text = (
                    f"collective stalled: waiting for rank {collective.laggard_rank} on {collective.laggard_node} "
                    f"({collective.evidence})"
                    if collective is not None
                    else "collectives progress again"
                )
            else:
                text = f"{kind} {name}: {before} -> {after}"
                if kind == "rank" and after == "stalled":
                    detail = next((r.detail for r in ranks if r.rank == name), "")
                    text += f" ({detail})" if detail else ""
            sev = (
                "info"
                if after in _QUIET or after == "ok"
                else ("error" if after in ("failed", "lost") else "warning")
            )
            self.ing.notices.append(Notice(now, sev, "health", text))
        self._prev_ranks, self._prev_nodes, self._prev_collective = cur_ranks, cur_nodes, coll


# ------------------------------------------------------------------------- how a view reads as text
# Every front end words the same facts the same way: the TUI's header, --no-tui's lines and
# `status` call these (and a test compares them field by field).


def duration_text(seconds: float | None) -> str:
    """3s, 4m05s, 2h07m, 3d04h: at most two units, never more than 6 characters."""
    if seconds is None:
        return "-"
    s = round(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def number_text(value: float | None, fmt: str = ".3g") -> str:
    return "-" if not isinstance(value, (int, float)) else format(value, fmt)


@dataclass(frozen=True)
class StallText:
    """One stalled rank as every front end names it."""

    rank: int
    node: str
    pid: int | None
    detail: str
    waiting: tuple[int, ...]  # the ranks blocked waiting for it
    stalled_for_s: float | None

    @property
    def text(self) -> str:
        waiting = f"; rank(s) {', '.join(map(str, self.waiting[:8]))} wait for it" if self.waiting else ""
        pid = f", pid {self.pid}" if self.pid is not None else ""
        return f"rank {self.rank} stalled (node {self.node}{pid}): {self.detail}{waiting}"


def stall_texts(view: RunView) -> tuple[StallText, ...]:
    waiting: dict[int, list[int]] = {}
    for r in view.ranks:
        if r.blocked_by is not None:
            waiting.setdefault(r.blocked_by, []).append(r.rank)
    return tuple(
        StallText(r.rank, r.node, r.pid, r.detail, tuple(waiting.get(r.rank, ())), r.heartbeat_age_s)
        for r in view.stalled
    )


@dataclass(frozen=True)
class Headline:
    """The numbers a one-line progress report shows, as text."""

    phase: str
    step: str  # "12/400" or "12" or "-"
    loss: str
    psnr: str
    clips_per_s: str
    eta: str
    mfu: str = ""  # "21.3 %"; "" where no MFU is known (CPU, or a GPU with no datasheet peak)
    slow: bool = False  # MFU below trainer.flops.LOW_MFU: the run crawls

    @property
    def text(self) -> str:
        mfu = f"mfu {self.mfu}{' (low)' if self.slow else ''} " if self.mfu else ""
        return (
            f"{self.phase} step {self.step} loss {self.loss} psnr {self.psnr} clips/s {self.clips_per_s} "
            f"{mfu}eta {self.eta}"
        )


def headline(view: RunView) -> Headline:
    run = view.run
    if run.step is not None and run.max_steps:
        step = f"{run.step}/{run.max_steps}"
    else:
        step = "-" if run.step is None else str(run.step)
    return Headline(
        phase=run.phase,
        step=step,
        loss=number_text(run.loss, ".4g"),
        psnr=number_text(run.psnr, ".2f"),
        clips_per_s=number_text(run.clips_per_s, ".3g"),
        eta=duration_text(run.eta_s),
        mfu=mfu_text(run.mfu),
        slow=low_mfu(run.mfu),
    )


def low_mfu(mfu: float | None) -> bool:
    """The run crawls: MFU below trainer.flops.LOW_MFU (the public project's 3-4 %)."""
    return mfu is not None and mfu < LOW_MFU


def mfu_text(mfu: float | None) -> str:
    return "" if not isinstance(mfu, (int, float)) else f"{100 * mfu:.1f} %"


def progress_dict(view: RunView) -> dict[str, Any]:
    """The run's progress as plain values (--json's `phase` and `result` lines, `status --json`)."""
    run = view.run
    return {
        "phase": run.phase,
        "step": run.step,
        "max_steps": run.max_steps,
        "loss": run.loss,
        "psnr": run.psnr,
        "samples_per_s": run.clips_per_s,
        "mfu": run.mfu,
        "lr": run.lr,
        "val_psnr": run.val_psnr,
        "eta_s": run.eta_s,
        "step_time_s": run.step_time_s,
        "checkpoint_step": view.checkpoints.newest_complete_step,
        "world_size": run.world_size,
        "stalled": [r.rank for r in view.stalled],
        "damaged": list(view.damaged),
    }
