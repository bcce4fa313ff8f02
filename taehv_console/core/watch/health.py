"""Health of ranks and nodes, as pure functions of what was observed (heartbeats, events, the
agents' process view, log signals) and a clock, so every decision is tested on recorded inputs.

Ranks: starting / healthy / straggler / stalled / failed / stopped.
- stalled: no heartbeat progress for `stall_factor` x the median step time (never under a floor;
  longer before the first step and at steps that validate or checkpoint).
- In data parallel training every rank waits in the same collectives, so when one rank hangs all
  heartbeats stop together. The rank holding the others up (its process stopped or dead, the one
  not blocked in a collective while the others are, a lower step, or the lowest last-completed
  count in the watchdog's lines) is the stalled one; the others
  are healthy and `blocked_by` it. That names the laggard long before the collective timeout.
  Ranks held by one collective go stale a beat apart: a rank stale alone is stalled in its own
  right only once another moved on clearly after it (or its process is stopped), and "nobody
  stands out" waits EVIDENCE_GRACE_S for the evidence that would name the laggard.
- straggler: score = fastest rank's own work per step / this rank's (the resilience tooling's
  convention: 1.0 fastest, 0.5 twice as slow), own work = step time - time waiting in all-reduces.
Nodes: ok / degraded / stalled / failed / lost (agent silent past its timeout).
"""

from __future__ import annotations

import operator
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from taehv_console.core.watch.nodesample import NodeSample, ProcessSample
from taehv_console.core.watch.nvml import SLOWDOWN_REASONS
from taehv_console.core.watch.state import (
    CollectiveStall,
    LogSignal,
    NodeState,
    RankHealth,
    RankState,
    copy_replacing,
)
from trainer.events import BEAT_EVERY_S, WAIT_TOLD_AFTER_S

# Every rank stale with nothing to tell them apart is judged only after this long: a waiting rank
# says so once its wait has lasted WAIT_TOLD_AFTER_S (then its watch thread's second and a poll),
# and an agent shows a stopped process within a sample. Only a stall bound shorter than this (a
# floor of a second or two, in tests) ever waits for it; the shipped floor is 10 s.
EVIDENCE_GRACE_S = WAIT_TOLD_AFTER_S + 2.0
_STOPPED = ("stopped", "tracing-stop")

# Log signals that end a rank when they name it (a peer connection lost is its victim's line: no).
FATAL_SIGNALS = frozenset(
    {"root_cause", "child_failed", "cuda_oom", "invalid_device_ordinal", "watchdog_timeout"}
)


@dataclass(frozen=True)
class HealthPolicy:
    stall_factor: float = 2.0  # x median step time without heartbeat progress -> stalled
    stall_floor_s: float = 10.0  # never sooner than this (a step can jitter that much)
    startup_grace_s: float = 600.0  # before the first step: model build, data, DeepSpeed init
    pause_grace_s: float = 180.0  # a validation or checkpoint step may pause this long
    straggler_threshold: float = 0.7  # score under this -> straggler
    straggler_window: int = 8  # recent steps whose median is compared (one odd step is not a trend)
    straggler_min_steps: int = 3
    straggler_min_gap_s: float = 0.05  # and slower by at least this much per step (timer jitter)
    agent_timeout_s: float = 5.0  # agent silent this long -> node lost
    agent_start_timeout_s: float = 30.0  # a starting agent's first line (SSH, python start on a busy node)
    process_stale_s: float = 10.0  # an agent's process view older than this is not trusted
    hot_gpu_c: float = 87.0  # where data-centre GPUs start to slow down


@dataclass(frozen=True)
class RankObservation:
    """Everything known about one rank at one instant (built by the monitor, immutable here)."""

    rank: int
    node: str
    step: int | None = None
    progress_time: float | None = None  # console clock: when `step` was reached
    step_times: tuple[float, ...] = ()  # recent steps of the current attempt
    busy: tuple[float, ...] = ()  # recent (step_time_s - wait_s)
    pid: int | None = None
    finished: str | None = None  # stop reason of the current attempt (done | signal | error)
    error: str | None = None  # error event of the current attempt
    process: ProcessSample | None = None
    process_time: float | None = None  # console clock of the agent sample holding `process`
    pause_allowance_s: float = 0.0  # this step validates or checkpoints: may pause this long
    signals: tuple[LogSignal, ...] = ()  # error lines naming this rank or its pid
    waiting_since: float | None = None  # console clock: blocked in a collective since (heartbeat)
    metrics: tuple[tuple[str, float], ...] = ()  # the heartbeat's other numbers, carried into RankHealth
    # medians of the last `straggler_window` step_times / busy, when the caller computed them once
    # (2,048 ranks twice a second: recomputing them per view was a large share of its cost)
    step_median: float | None = None
    busy_median: float | None = None


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _fatal_signal(o: RankObservation, process_alive: bool | None) -> LogSignal | None:
    for s in reversed(o.signals):
        if s.kind not in FATAL_SIGNALS or s.severity != "error":
            continue
        pid = s.get("pid")
        if pid is not None and o.pid is not None:
            if pid == o.pid:
                return s
            continue  # names another process: an earlier attempt of this rank
        # No pid in the line: believe it unless the rank has visibly lived on since it was read.
        if process_alive or (o.progress_time is not None and o.progress_time > s.seen):
            continue
        return s
    return None


@dataclass(frozen=True)
class _StepStats:
    """What the ranks' recent step times add up to: the stall limit, each rank's own-work median
    and score against the fastest, and the ranks slow enough to be stragglers."""

    stall_after: float | None
    busy_med: dict[int, float]
    fastest: float | None
    scores: dict[int, float]
    slow: tuple[int, ...]


def _step_stats(obs: Sequence[RankObservation], policy: HealthPolicy) -> _StepStats:
    window = policy.straggler_window
    median_step = _median([t for o in obs for t in o.step_times[-window:]])
    stall_after = max(policy.stall_floor_s, policy.stall_factor * median_step) if median_step else None
    busy_med: dict[int, float] = {}
    for o in obs:
        if len(o.busy) >= policy.straggler_min_steps:
            med = o.busy_median if o.busy_median is not None else _median(o.busy[-window:])
            if med is not None:
                busy_med[o.rank] = med
    fastest = min(busy_med.values()) if busy_med else None
    scores: dict[int, float] = {}
    slow: tuple[int, ...] = ()
    if fastest is not None:
        scores = {r: round(min(1.0, fastest / b), 3) for r, b in busy_med.items() if b}
        slow = tuple(
            r
            for r, sc in scores.items()
            if sc < policy.straggler_threshold and busy_med[r] - fastest >= policy.straggler_min_gap_s
        )
    return _StepStats(stall_after, busy_med, fastest, scores, slow)


@dataclass
class AssessMemo:
    """The step statistics of the last assess_ranks call, for a caller that assesses the same ranks
    over and over (the monitor, twice a second). With 2,048 ranks, the medians over every rank's
    recent steps were the largest share of a view's cost, and they change only with heartbeats:
    they are reused while every rank's step and own-work tuples are the very same objects."""

    ranks: tuple[int, ...] = ()
    steps: list[tuple[float, ...]] = field(default_factory=list)  # held, so identities stay unique
    busy: list[tuple[float, ...]] = field(default_factory=list)
    policy: HealthPolicy | None = None
    stats: _StepStats | None = None
    reused: int = 0  # calls answered from the memo (tests check that it is used)
    # rank -> (observation, step stats, a RankHealth holding what follows from those two alone)
    rows: dict[int, tuple[RankObservation, _StepStats, RankHealth]] = field(default_factory=dict)

    def step_stats(self, obs: Sequence[RankObservation], policy: HealthPolicy) -> _StepStats:
        steps = [o.step_times for o in obs]
        busy = [o.busy for o in obs]
        ranks = tuple(o.rank for o in obs)
        if (
            self.stats is not None
            and policy == self.policy
            and ranks == self.ranks
            and all(map(operator.is_, steps, self.steps))
            and all(map(operator.is_, busy, self.busy))
        ):
            self.reused += 1
            return self.stats
        self.ranks, self.steps, self.busy, self.policy = ranks, steps, busy, policy
        self.stats = _step_stats(obs, policy)
        return self.stats


def _same_rank_facts(a: RankObservation, b: RankObservation) -> bool:
    """Whether two observations agree on what a health row holds besides the clock-dependent part:
    a new agent sample makes a new observation (its process view) but leaves these as they were."""
    return a is b or (
        a.step_times is b.step_times
        and a.metrics is b.metrics
        and a.step == b.step
        and a.pid == b.pid
        and a.node == b.node
        and a.step_median == b.step_median
    )


def assess_ranks(
    obs: Sequence[RankObservation],
    policy: HealthPolicy,
    now: float,
    *,
    watchdog: Mapping[int, int] | None = None,
    collective_timeout_s: float | None = None,
    memo: AssessMemo | None = None,
) -> tuple[tuple[RankHealth, ...], CollectiveStall | None]:
    """Per-rank health, and the collective stall (with its laggard) when every rank is stuck.
    `memo`: keep the step statistics between calls on the same ranks (AssessMemo)."""
    window = policy.straggler_window
    stats = memo.step_stats(obs, policy) if memo is not None else _step_stats(obs, policy)
    stall_after, busy_med, fastest, scores = stats.stall_after, stats.busy_med, stats.fastest, stats.scores

    out: dict[int, RankHealth] = {}
    stale: dict[int, float] = {}  # rank -> seconds without progress, for the stale ones
    ages: dict[int, float] = {}  # rank -> seconds without progress
    rows = memo.rows if memo is not None else None
    for o in obs:
        proc = o.process
        fresh = (
            proc is not None and o.process_time is not None and now - o.process_time <= policy.process_stale_s
        )
        alive = proc.alive if (fresh and proc is not None) else None
        age = None if o.progress_time is None else max(0.0, now - o.progress_time)
        ages[o.rank] = age or 0.0
        sig = _fatal_signal(o, alive) if o.signals else None
        detail = ""
        if o.finished is not None:
            failed = o.finished == "error"
            state = RankState.FAILED if failed else RankState.STOPPED
            detail = (o.error or "stopped with an error") if failed else f"stopped: {o.finished}"
        elif o.error:
            state, detail = RankState.FAILED, o.error
        elif alive is False:
            state, detail = RankState.FAILED, f"process {o.pid} is {proc.status}"  # type: ignore[union-attr]
        elif sig is not None:
            state, detail = RankState.FAILED, sig.text
        elif o.step is None or age is None:
            state, detail = RankState.STARTING, "no heartbeat yet"
        else:
            if not o.step_times:  # no step finished in this attempt yet
                limit = policy.startup_grace_s
            else:
                limit = max(stall_after or policy.startup_grace_s, o.pause_allowance_s)
            if age > limit:
                stale[o.rank] = age
            state = RankState.STARTING if not o.step_times else RankState.HEALTHY
        row = rows.get(o.rank) if rows is not None else None
        if row is None or row[1] is not stats or not _same_rank_facts(row[0], o):
            # what does not change with the clock, kept while the rank's facts and the statistics stand
            fixed = RankHealth(
                rank=o.rank,
                node=o.node,
                state=RankState.STARTING,
                step=o.step,
                pid=o.pid,
                step_time_s=o.step_median if o.step_median is not None else _median(o.step_times[-window:]),
                busy_s=busy_med.get(o.rank),
                score=scores.get(o.rank),
                metrics=o.metrics,
            )
            if rows is not None:
                rows[o.rank] = (o, stats, fixed)
        else:
            fixed = row[2]
        out[o.rank] = copy_replacing(
            fixed,
            state=state,
            heartbeat_age_s=age,
            detail=detail,
            process=proc.status if (fresh and proc) else "",
            waiting_s=None if o.waiting_since is None else round(max(0.0, now - o.waiting_since), 1),
        )

    collective = None
    # A rank that says it is blocked in a collective is not moving on, however fresh its last step:
    # its peer stopped after it finished a step, or before its own last beat was written.
    blocked = {
        o.rank: ages[o.rank]
        for o in obs
        if stale
        and o.waiting_since is not None
        and o.rank not in stale
        and out[o.rank].state in (RankState.HEALTHY, RankState.STARTING)
    }
    others = [
        r
        for r, h in out.items()
        if h.state in (RankState.HEALTHY, RankState.STARTING) and r not in stale and r not in blocked
    ]
    if stale and not others:
        collective = _collective(
            out, {**stale, **blocked}, {o.rank: o for o in obs}, watchdog or {}, collective_timeout_s
        )
    elif stale:
        # One rank silent while the others move on is its own problem. But ranks held by one
        # collective go stale a beat apart (beats are written at most once a second), and the first
        # of them is not at fault for that: another rank moves on only once it progressed clearly
        # after the stale ones stopped. Until then a stale rank is judged on its own evidence alone.
        moved_on_before = min(stale.values()) - max((stall_after or 0.0) / 2, BEAT_EVERY_S)
        moving = any(ages[r] <= moved_on_before for r in others)
        for r, age in stale.items():
            if out[r].process in _STOPPED:
                detail = f"{_stopped_evidence(out[r])}; no heartbeat progress for {age:.0f} s"
            elif moving:
                detail = f"no heartbeat progress for {age:.0f} s while other ranks progress"
            else:  # in doubt for a poll or two: the others stop too (a collective stall) or move on
                continue
            out[r] = replace(out[r], state=RankState.STALLED, detail=detail)

    for r in stats.slow:  # slow enough: a straggler unless something worse holds it
        h = out[r]
        if h.state is RankState.HEALTHY and h.blocked_by is None:
            out[r] = replace(
                h,
                state=RankState.STRAGGLER,
                detail=f"{busy_med[r]:.2f} s of own work per step vs {fastest:.2f} s on the "
                f"fastest rank (score {h.score:.2f})",
            )
    return tuple(out[r] for r in sorted(out)), collective


def _stopped_evidence(h: RankHealth) -> str:
    return f"process {h.pid} of rank {h.rank} is stopped (signal)"


def _collective(
    out: dict[int, RankHealth],
    stale: dict[int, float],
    by_rank: Mapping[int, RankObservation],
    watchdog: Mapping[int, int],
    timeout_s: float | None,
) -> CollectiveStall | None:
    """Every live rank is stuck: find who the others wait for, mark it stalled, the rest blocked."""
    failed = [r for r, h in out.items() if h.state is RankState.FAILED]
    stopped = [r for r in stale if out[r].process in _STOPPED]
    steps = {r: rank_step for r in stale if (rank_step := out[r].step) is not None}
    # The trainer says in its heartbeat when it has been blocked in a collective for a while: the
    # ranks that are not (stuck in data loading or compute, or not running at all) hold the others.
    waiting = [r for r in stale if by_rank[r].waiting_since is not None]
    not_waiting = [r for r in stale if by_rank[r].waiting_since is None]
    culprits: list[int] = []
    evidence = ""
    if failed:
        culprits, evidence = failed, f"rank {failed[0]} failed: {out[failed[0]].detail}"
    elif stopped:
        culprits, evidence = (
            stopped,
            _stopped_evidence(out[stopped[0]]),
        )
    elif waiting and not_waiting:
        culprits = not_waiting
        others = ", ".join(map(str, waiting[:8])) + (" ..." if len(waiting) > 8 else "")
        evidence = (
            f"rank {culprits[0]} is not in a collective while rank(s) {others} wait in one "
            f"(no progress for {stale[culprits[0]]:.0f} s)"
        )
    elif steps and min(steps.values()) < max(steps.values()):
        low = min(steps.values())
        culprits = [r for r, s in steps.items() if s == low]
        evidence = f"rank {culprits[0]} is at step {low}, the others finished step {max(steps.values())}"
    else:
        counts = {r: c for r, c in watchdog.items() if r in out}
        if counts and min(counts.values()) < max(counts.values()):
            low = min(counts.values())
            culprits = [r for r, c in counts.items() if c == low]
            evidence = (
                f"watchdog: rank {culprits[0]} completed NCCL work {low}, others {max(counts.values())}"
            )
    stalled_for = min(stale.values())
    if not culprits and stalled_for < EVIDENCE_GRACE_S:
        return None  # the evidence that names the laggard may still be on its way
    if not culprits:
        for r, age in stale.items():
            out[r] = replace(
                out[r],
                state=RankState.STALLED,
                detail=f"no heartbeat progress for {age:.0f} s on any rank; the laggard is not known",
            )
        return CollectiveStall(
            None,
            None,
            min(steps.values()) if steps else None,
            stalled_for,
            timeout_s,
            tuple(sorted(stale)),
            "every rank stopped at once; no rank stands out",
        )
    laggard = culprits[0]
    for r, age in stale.items():
        if r in culprits:
            out[r] = replace(out[r], state=RankState.STALLED, detail=evidence)
        else:
            out[r] = replace(
                out[r], blocked_by=laggard, detail=f"waiting in a collective for rank {laggard} ({age:.0f} s)"
            )
    blocked = tuple(sorted(r for r in stale if r not in culprits))
    return CollectiveStall(
        laggard,
        out[laggard].node,
        min(steps.values()) if steps else None,
        stalled_for,
        timeout_s,
        blocked,
        evidence,
    )


def assess_node(
    name: str,
    ranks: Sequence[RankHealth],
    sample: NodeSample | None,
    sample_age_s: float | None,
    policy: HealthPolicy,
    *,
    agent_expected: bool,
    agent_running_for_s: float | None = None,
    agent_down: str = "",
) -> tuple[NodeState, str]:
    """A node's state and a one-line reason. Worst first: failed, stalled, lost, degraded.
    `agent_running_for_s`: since the first attempt to start its agent; `agent_down`: why the agent
    is not running right now ("" when it is, or is starting)."""
    for state, rank_state in ((NodeState.FAILED, RankState.FAILED), (NodeState.STALLED, RankState.STALLED)):
        bad = [r for r in ranks if r.state is rank_state]
        if bad:
            more = f" (+{len(bad) - 1} more)" if len(bad) > 1 else ""
            return state, f"rank {bad[0].rank} {rank_state.value}: {bad[0].detail}{more}"
    if agent_expected:
        if sample is None and agent_running_for_s is not None:
            # A node never heard from: lost once its agent could not start, or when a started one
            # has not said anything for longer than a start may take.
            limit = policy.agent_timeout_s if agent_down else policy.agent_start_timeout_s
            if agent_running_for_s > limit:
                why = f": {agent_down}" if agent_down else ""
                return NodeState.LOST, f"no agent sample in {agent_running_for_s:.0f} s{why}"
        # an agent that samples every few seconds (a large cluster) is silent for longer between lines
        elif (
            sample is not None
            and sample_age_s is not None
            and sample_age_s > max(policy.agent_timeout_s, 3 * sample.interval_s)
        ):
            return NodeState.LOST, f"agent silent for {sample_age_s:.0f} s"
    problems = []
    slow = [r for r in ranks if r.state is RankState.STRAGGLER]
    if slow:
        problems.append(f"rank {slow[0].rank} straggler (score {slow[0].score})")
    if sample is not None:
        for g in sample.gpus:
            if g.error:
                problems.append(f"GPU {g.index}: {g.error}")
            elif g.temp_c is not None and g.temp_c >= policy.hot_gpu_c:
                problems.append(f"GPU {g.index} at {g.temp_c:.0f} C")
            elif SLOWDOWN_REASONS.intersection(g.throttle):
                problems.append(
                    f"GPU {g.index} slowed down: {', '.join(sorted(SLOWDOWN_REASONS.intersection(g.throttle)))}"
                )
    if problems:
        return NodeState.DEGRADED, "; ".join(problems)
    if sample is None and not ranks:
        return NodeState.UNKNOWN, "waiting for the agent" if agent_expected else "no ranks seen"
    return NodeState.OK, ""


def watchdog_counts(signals: Sequence[LogSignal]) -> dict[int, int]:
    """rank -> newest last-completed NCCL work count from the watchdog's lines."""
    out: dict[int, int] = {}
    for s in signals:
        if s.kind == "nccl_progress" and s.rank is not None and s.get("last_completed") is not None:
            out[s.rank] = int(s.get("last_completed"))
    return out
