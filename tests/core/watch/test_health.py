"""Health decisions as pure functions of observations and a clock."""

from __future__ import annotations

from dataclasses import replace

import pytest

from taehv_console.core.logscan import LogSignal
from taehv_console.core.watch.health import (
    EVIDENCE_GRACE_S,
    HealthPolicy,
    RankObservation,
    assess_node,
    assess_ranks,
)
from taehv_console.core.watch.nodeline import parse_sample
from taehv_console.core.watch.nodesample import ProcessSample
from taehv_console.core.watch.state import NodeState, RankState
from tests.core.watch.conftest import agent_line, nvml_fixture

NOW = 10_000.0
POL = HealthPolicy(stall_floor_s=5.0)


def obs(
    rank: int,
    *,
    age: float = 0.5,
    step: int = 100,
    times=(1.0,) * 8,
    busy=None,
    status: str | None = "running",
    node: str = "n0",
    **kw,
) -> RankObservation:
    proc = ProcessSample(pid=1000 + rank, rank=rank, status=status) if status else None
    return RankObservation(
        rank=rank,
        node=node,
        step=step,
        progress_time=NOW - age,
        step_times=tuple(times),
        busy=tuple(busy if busy is not None else times),
        pid=1000 + rank,
        process=proc,
        process_time=NOW - 0.3 if status else None,
        **kw,
    )


def states(ranks):
    return [r.state for r in ranks]


def test_all_progressing_is_healthy_with_scores_near_one():
    ranks, coll = assess_ranks([obs(0), obs(1, busy=[0.95] * 8)], POL, NOW)
    assert states(ranks) == [RankState.HEALTHY, RankState.HEALTHY] and coll is None
    assert ranks[1].score == 1.0 and ranks[0].score == pytest.approx(0.95)
    assert ranks[0].step_time_s == 1.0 and ranks[0].heartbeat_age_s == pytest.approx(0.5)


def test_stall_threshold_is_k_times_the_median_step_with_a_floor():
    pol = HealthPolicy(stall_factor=2.0, stall_floor_s=5.0)
    # median step 4 s: the limit is 8 s, above the 5 s floor
    ranks, _ = assess_ranks([obs(0, age=7.9, times=[4.0] * 8), obs(1, age=0.1, times=[4.0] * 8)], pol, NOW)
    assert ranks[0].state is RankState.HEALTHY
    ranks, _ = assess_ranks([obs(0, age=8.1, times=[4.0] * 8), obs(1, age=0.1, times=[4.0] * 8)], pol, NOW)
    assert ranks[0].state is RankState.STALLED and "while other ranks progress" in ranks[0].detail
    # fast steps: the floor holds
    ranks, _ = assess_ranks([obs(0, age=4.0, times=[0.1] * 8), obs(1, age=0.0, times=[0.1] * 8)], pol, NOW)
    assert ranks[0].state is RankState.HEALTHY


def test_before_the_first_step_the_startup_grace_applies():
    pol = HealthPolicy(startup_grace_s=300)
    ranks, coll = assess_ranks(
        [obs(0, age=200, times=(), busy=()), obs(1, age=200, times=(), busy=())], pol, NOW
    )
    assert states(ranks) == [RankState.STARTING] * 2 and coll is None
    ranks, coll = assess_ranks(
        [obs(0, age=301, times=(), busy=()), obs(1, age=301, times=(), busy=())], pol, NOW
    )
    assert states(ranks) == [RankState.STALLED] * 2 and coll is not None and coll.laggard_rank is None


def test_a_validation_or_checkpoint_step_may_pause_longer():
    a = [obs(0, age=60, pause_allowance_s=180), obs(1, age=60, pause_allowance_s=180)]
    ranks, coll = assess_ranks(a, POL, NOW)
    assert states(ranks) == [RankState.HEALTHY] * 2 and coll is None
    ranks, coll = assess_ranks([replace(o, progress_time=NOW - 181) for o in a], POL, NOW)
    assert coll is not None


def test_stopped_process_is_the_laggard_and_the_others_are_blocked_not_stalled():
    # SIGSTOP on rank 1: every heartbeat stops (rank 0 waits in the all-reduce), rank 1's process is 'stopped'
    ranks, coll = assess_ranks(
        [obs(0, age=12), obs(1, age=12.2, status="stopped"), obs(2, age=12)],
        POL,
        NOW,
        collective_timeout_s=600,
    )
    assert states(ranks) == [RankState.HEALTHY, RankState.STALLED, RankState.HEALTHY]
    assert ranks[0].blocked_by == 1 and ranks[2].blocked_by == 1 and ranks[1].blocked_by is None
    assert ranks[1].process == "stopped" and "stopped" in ranks[1].detail
    assert coll.laggard_rank == 1 and coll.laggard_node == "n0" and coll.waiting_ranks == (0, 2)
    assert coll.stalled_for_s == pytest.approx(12) and coll.timeout_in_s == pytest.approx(588)


def test_a_rank_one_step_behind_is_the_laggard():
    ranks, coll = assess_ranks([obs(0, age=20, step=51), obs(1, age=30, step=50, node="n1")], POL, NOW)
    assert coll.laggard_rank == 1 and coll.laggard_node == "n1" and coll.step == 50
    assert ranks[1].state is RankState.STALLED and ranks[0].blocked_by == 1


def test_watchdog_counts_name_the_laggard_when_heartbeats_cannot():
    a = [obs(r, age=40, status=None) for r in range(4)]
    ranks, coll = assess_ranks(a, POL, NOW, watchdog={0: 6462, 1: 6462, 2: 6461, 3: 6462})
    assert coll.laggard_rank == 2 and "6461" in coll.evidence
    assert [r.state for r in ranks] == [
        RankState.HEALTHY,
        RankState.HEALTHY,
        RankState.STALLED,
        RankState.HEALTHY,
    ]


def test_nobody_stands_out_means_everyone_stalled_and_the_laggard_unknown():
    ranks, coll = assess_ranks([obs(0, age=40), obs(1, age=40)], POL, NOW)
    assert (
        states(ranks) == [RankState.STALLED] * 2
        and coll.laggard_rank is None
        and coll.waiting_ranks == (0, 1)
    )


# A short stall bound (a floor of 1 s with 0.7 s steps: 1.4 s), as a test or a user with fast
# steps may set it: the evidence that tells the ranks apart can come after the first goes stale.
FAST = HealthPolicy(stall_floor_s=1.0)
STEPS_07 = (0.7,) * 8


def test_every_rank_stale_with_no_evidence_yet_is_not_judged_within_the_grace():
    """Rank 1 was stopped a moment ago: both heartbeats are just past the bound, the agent has not
    yet shown rank 1 stopped and rank 0 has not yet said it waits. Nobody is called stalled yet."""
    fresh = [obs(0, age=1.6, times=STEPS_07), obs(1, age=1.5, times=STEPS_07)]
    ranks, coll = assess_ranks(fresh, FAST, NOW)
    assert coll is None and states(ranks) == [RankState.HEALTHY] * 2
    # the evidence arrives: the laggard is named at once
    ranks, coll = assess_ranks([fresh[0], obs(1, age=1.5, times=STEPS_07, status="stopped")], FAST, NOW)
    assert (
        coll is not None
        and coll.laggard_rank == 1
        and states(ranks) == [RankState.HEALTHY, RankState.STALLED]
    )
    ranks, coll = assess_ranks(
        [obs(0, age=1.6, times=STEPS_07, waiting_since=NOW - 1.2), fresh[1]], FAST, NOW
    )
    assert coll is not None and coll.laggard_rank == 1 and ranks[0].blocked_by == 1
    # none by the end of the grace: every rank stalled, the laggard unknown
    late = EVIDENCE_GRACE_S + 0.1
    ranks, coll = assess_ranks(
        [obs(0, age=late, times=STEPS_07), obs(1, age=late, times=STEPS_07)], FAST, NOW
    )
    assert coll is not None and coll.laggard_rank is None and states(ranks) == [RankState.STALLED] * 2
    ranks, coll = assess_ranks(
        [obs(0, age=late - 0.2, times=STEPS_07), obs(1, age=late - 0.2, times=STEPS_07)], FAST, NOW
    )
    assert coll is None


def test_a_rank_stale_a_beat_before_its_peer_is_not_alone_in_its_silence():
    """Rank 0's last beat is a few ms older than rank 1's, and rank 1 is the one stopped: rank 0 is
    stale first, but rank 1 did not move on after it; neither is judged until the evidence says."""
    ranks, coll = assess_ranks([obs(0, age=1.5, times=STEPS_07), obs(1, age=1.3, times=STEPS_07)], FAST, NOW)
    assert coll is None and states(ranks) == [RankState.HEALTHY] * 2
    # a peer that progressed clearly later (more than a beat and half the bound) is moving on
    ranks, coll = assess_ranks([obs(0, age=1.5, times=STEPS_07), obs(1, age=0.4, times=STEPS_07)], FAST, NOW)
    assert coll is None and states(ranks) == [RankState.STALLED, RankState.HEALTHY]
    assert "while other ranks progress" in ranks[0].detail
    # a stale rank whose own process is stopped needs nobody else's progress to be called stalled
    ranks, coll = assess_ranks(
        [obs(0, age=1.3, times=STEPS_07), obs(1, age=1.5, times=STEPS_07, status="stopped")], FAST, NOW
    )
    assert coll is None and states(ranks) == [RankState.HEALTHY, RankState.STALLED]
    assert "process 1001 of rank 1 is stopped" in ranks[1].detail


def test_a_stale_agent_view_is_not_trusted_for_the_laggard():
    o1 = replace(obs(1, age=40, status="stopped"), process_time=NOW - 60)  # the agent's view is a minute old
    ranks, coll = assess_ranks([obs(0, age=40), o1], POL, NOW)
    assert coll.laggard_rank is None and ranks[1].process == ""


def test_failed_by_process_death_error_event_or_log_line():
    sig = LogSignal(
        "root_cause",
        "error",
        "node-0.log",
        60,
        "root cause: rank 1",
        rank=1,
        fields=(("pid", 1001),),
        seen=NOW - 1,
    )
    cases = [
        (obs(1, status="gone"), "process 1001 is gone"),
        (obs(1, status="zombie"), "zombie"),
        (obs(1, error="CUDA out of memory"), "CUDA out of memory"),
        (obs(1, signals=(sig,), status=None, age=5), "root cause"),
    ]
    for o, detail in cases:
        ranks, _ = assess_ranks([obs(0), o], POL, NOW)
        assert ranks[1].state is RankState.FAILED and detail in ranks[1].detail, (o, ranks[1])


def test_a_log_line_about_another_attempt_does_not_fail_the_rank():
    old = LogSignal(
        "root_cause", "error", "node-0.log", 60, "x", rank=1, fields=(("pid", 999),), seen=NOW - 1
    )
    ranks, _ = assess_ranks([obs(0), obs(1, signals=(old,))], POL, NOW)
    assert ranks[1].state is RankState.HEALTHY  # pid 999 is not this rank's process (1001)
    # no pid in the line: disbelieved once the rank visibly went on after it was read
    oom = LogSignal("cuda_oom", "error", "node-0.log", 9, "CUDA out of memory", rank=1, seen=NOW - 30)
    ranks, _ = assess_ranks([obs(0), obs(1, signals=(oom,), status=None, age=1)], POL, NOW)
    assert ranks[1].state is RankState.HEALTHY
    # ...and believed when it has not
    ranks, _ = assess_ranks([obs(0), obs(1, signals=(oom,), status=None, age=40)], POL, NOW)
    assert ranks[1].state is RankState.FAILED


def test_a_dead_rank_makes_the_waiting_ones_blocked_by_it():
    ranks, coll = assess_ranks([obs(0, age=30), obs(1, age=31, status="gone")], POL, NOW)
    assert (
        ranks[1].state is RankState.FAILED
        and ranks[0].state is RankState.HEALTHY
        and ranks[0].blocked_by == 1
    )
    assert coll.laggard_rank == 1


def test_stopped_ranks_are_not_faults():
    ranks, coll = assess_ranks(
        [obs(0, age=999, finished="done", status="gone"), obs(1, age=999, finished="signal", status="gone")],
        POL,
        NOW,
    )
    assert states(ranks) == [RankState.STOPPED] * 2 and coll is None
    ranks, _ = assess_ranks([obs(0, finished="error", error="boom")], POL, NOW)
    assert ranks[0].state is RankState.FAILED and ranks[0].detail == "boom"


def test_straggler_score_against_the_fastest_rank():
    # rank 1 sleeps 2 s per step before its forward: its own work is 4.6 s vs 2.6 s (live figures)
    ranks, _ = assess_ranks(
        [obs(0, times=[4.6] * 8, busy=[2.6] * 8), obs(1, times=[4.6] * 8, busy=[4.6] * 8)], POL, NOW
    )
    assert ranks[1].state is RankState.STRAGGLER and ranks[1].score == pytest.approx(2.6 / 4.6, abs=1e-3)
    assert ranks[0].state is RankState.HEALTHY and ranks[0].score == 1.0
    assert f"(score {ranks[1].score:.2f})" in ranks[1].detail and "2.60 s on the fastest" in ranks[1].detail


def test_no_straggler_on_jitter_one_odd_step_or_too_few_steps():
    noisy = [2.6, 2.8, 2.5, 2.9, 2.7, 2.6, 2.8, 2.7]
    ranks, _ = assess_ranks([obs(0, busy=noisy), obs(1, busy=[b * 1.2 for b in noisy])], POL, NOW)
    assert RankState.STRAGGLER not in states(ranks)  # 20% slower: within the 0.7 threshold
    spike = [2.6] * 7 + [30.0]  # one step held by a SIGSTOP
    ranks, _ = assess_ranks([obs(0, busy=[2.6] * 8), obs(1, busy=spike)], POL, NOW)
    assert RankState.STRAGGLER not in states(ranks)
    ranks, _ = assess_ranks([obs(0, busy=[1.0, 1.0]), obs(1, busy=[5.0, 5.0])], POL, NOW)
    assert RankState.STRAGGLER not in states(ranks) and ranks[1].score is None  # 2 steps are not a trend
    tiny = HealthPolicy(straggler_min_gap_s=0.05)
    ranks, _ = assess_ranks([obs(0, busy=[0.01] * 8), obs(1, busy=[0.03] * 8)], tiny, NOW)
    assert RankState.STRAGGLER not in states(ranks)  # 20 ms of timer noise is not a straggler


def test_a_blocked_rank_is_not_called_a_straggler():
    ranks, _ = assess_ranks(
        [obs(0, age=30, busy=[9.0] * 8), obs(1, age=30, status="stopped", busy=[1.0] * 8)], POL, NOW
    )
    assert ranks[0].state is RankState.HEALTHY and ranks[0].blocked_by == 1


# ----------------------------------------------------------------------------------------- nodes


def sample(fixture: str):
    return parse_sample(agent_line(fixture), received=NOW - 0.5)


def test_node_state_from_its_ranks_worst_first():
    ranks, _ = assess_ranks(
        [obs(0, age=30), obs(1, age=30, status="stopped"), obs(2, status="gone")], POL, NOW
    )
    state, detail = assess_node("n0", ranks, None, None, POL, agent_expected=False)
    assert state is NodeState.FAILED and detail.startswith("rank 2 failed") and "+" not in detail
    ranks, _ = assess_ranks([obs(0, age=30), obs(1, age=30, status="stopped")], POL, NOW)
    assert assess_node("n0", ranks, None, None, POL, agent_expected=False)[0] is NodeState.STALLED


def test_node_lost_when_its_agent_is_silent_past_the_timeout():
    s = sample("agent_line_h100_node2.json")
    pol = HealthPolicy(agent_timeout_s=5.0)
    assert assess_node("g2", [], s, 4.9, pol, agent_expected=True)[0] is NodeState.OK
    state, detail = assess_node("g2", [], s, 5.1, pol, agent_expected=True)
    assert state is NodeState.LOST and "silent for 5 s" in detail
    # never heard from: a starting agent gets the start timeout, one that cannot start only the agent timeout
    assert (
        assess_node("g2", [], None, None, pol, agent_expected=True, agent_running_for_s=6)[0]
        is NodeState.UNKNOWN
    )
    assert (
        assess_node("g2", [], None, None, pol, agent_expected=True, agent_running_for_s=31)[0]
        is NodeState.LOST
    )
    state, detail = assess_node(
        "g2",
        [],
        None,
        None,
        pol,
        agent_expected=True,
        agent_running_for_s=6,
        agent_down="restarting in 10 s: cannot start: Connection refused",
    )
    assert state is NodeState.LOST and detail.endswith("Connection refused")


def test_node_degraded_by_gpu_problems_from_recorded_readings():
    base = sample("agent_line_h100_node2.json")
    assert assess_node("g2", [], base, 0.5, POL, agent_expected=True) == (NodeState.OK, "")
    from taehv_console.core.watch.nodeline import gpu_samples

    lost = replace(base, gpus=gpu_samples(nvml_fixture("h100x8_gpu5_lost.json")))
    assert assess_node("g2", [], lost, 0.5, POL, agent_expected=True) == (
        NodeState.DEGRADED,
        "GPU 5: GPU is lost",
    )
    hot = replace(base, gpus=gpu_samples(nvml_fixture("a100x8_gpu2_thermal.json")))
    state, detail = assess_node("g2", [], hot, 0.5, POL, agent_expected=True)
    assert state is NodeState.DEGRADED and detail == "GPU 2 at 91 C"


def test_node_degraded_by_a_straggler():
    ranks, _ = assess_ranks([obs(0, busy=[1.0] * 8), obs(1, busy=[3.0] * 8)], POL, NOW)
    state, detail = assess_node("n0", ranks, None, None, POL, agent_expected=False)
    assert state is NodeState.DEGRADED and "rank 1 straggler" in detail


@pytest.mark.parametrize("status", ["running", "sleeping", None])
def test_the_rank_not_waiting_in_a_collective_holds_up_those_that_are(status):
    """A rank stuck in data loading or compute (its process running, or no agent at all): every
    heartbeat is stale at the same step, but the peers' heartbeats say they wait in an all-reduce."""
    ranks, coll = assess_ranks(
        [
            obs(0, age=30, status=status, waiting_since=NOW - 28),
            obs(1, age=30, status=status),
            obs(2, age=30, status=status, waiting_since=NOW - 27),
        ],
        POL,
        NOW,
    )
    assert states(ranks) == [RankState.HEALTHY, RankState.STALLED, RankState.HEALTHY]
    assert ranks[0].blocked_by == 1 and ranks[2].blocked_by == 1 and ranks[0].waiting_s == 28.0
    assert coll is not None and coll.laggard_rank == 1 and coll.waiting_ranks == (0, 2)
    assert "not in a collective" in ranks[1].detail
    # without the waiting marks nobody stands out: every rank stalled, laggard unknown
    ranks, coll = assess_ranks([obs(0, age=30, status=status), obs(1, age=30, status=status)], POL, NOW)
    assert coll is not None and coll.laggard_rank is None


@pytest.mark.parametrize("status", ["running", "sleeping", None])
def test_a_peer_waiting_after_a_newer_step_is_blocked_not_moving_on(status):
    """Rank 1 stopped in the middle of a step; rank 0 finished one step more (or wrote its beat
    later) and now waits in a collective for it. At the stall bound rank 1 is stale and rank 0 is
    not yet, but rank 0 is not moving on: it is a collective stall, rank 1 holding rank 0 up, not
    rank 1's own silence while the others progress."""
    ranks, coll = assess_ranks(
        [obs(0, age=3.5, step=101, status=status, waiting_since=NOW - 2.5), obs(1, age=6, status=status)],
        POL,
        NOW,
    )
    assert states(ranks) == [RankState.HEALTHY, RankState.STALLED]
    assert ranks[0].blocked_by == 1 and ranks[0].waiting_s == 2.5
    assert coll is not None and coll.laggard_rank == 1 and coll.waiting_ranks == (0,)
    assert "while other ranks progress" not in ranks[1].detail
    # the same picture without rank 0's wait: rank 1's own silence, rank 0 healthy and not blocked
    ranks, coll = assess_ranks(
        [obs(0, age=3.5, step=101, status=status), obs(1, age=6, status=status)], POL, NOW
    )
    assert coll is None and ranks[0].blocked_by is None
    assert states(ranks) == [RankState.HEALTHY, RankState.STALLED]
    assert "while other ranks progress" in ranks[1].detail
    # and a short wait with nobody stale is nothing at all
    ranks, coll = assess_ranks([obs(0, age=2.5, waiting_since=NOW - 2.2), obs(1, age=2.5)], POL, NOW)
    assert coll is None and states(ranks) == [RankState.HEALTHY, RankState.HEALTHY]


def test_an_agent_that_samples_every_few_seconds_is_lost_only_after_three_of_its_intervals():
    """Past 128 nodes agents sample less often (every 2 s at 256 nodes): the silence that makes a
    node lost stretches with the interval its own samples state, and no further."""
    from taehv_console.core.watch.state import NodeSample

    pol = HealthPolicy()  # agent_timeout_s 5
    for interval, quiet, lost in ((1.0, 4.5, False), (1.0, 5.5, True), (2.0, 5.5, False), (2.0, 6.5, True)):
        sample = NodeSample(host="n", time=0.0, interval_s=interval)
        state, detail = assess_node("n", [], sample, quiet, pol, agent_expected=True)
        assert (state is NodeState.LOST) is lost, (interval, quiet, state, detail)


def test_past_128_nodes_the_agents_sample_less_often_and_are_drained_as_often(tmp_path):
    from taehv_console.core.watch.monitor import Monitor, _AgentPoller

    for nodes, interval in ((1, 1.0), (64, 1.0), (128, 1.0), (256, 2.0), (512, 4.0)):
        mon = Monitor(tmp_path, hosts=[f"node-{i:03d}" for i in range(nodes)])
        assert mon.agent_interval_s == interval, nodes
        pollers = [p for p in mon._pollers if isinstance(p, _AgentPoller)]
        assert len(pollers) == nodes and {p.interval_s for p in pollers} == {interval}
