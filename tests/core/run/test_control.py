"""Run control against real processes: the node wrapper, fake torchrun launchers whose ranks live in
sessions of their own, real signals. What is asserted is what a user relies on: a stop leaves a
checkpoint and nothing else behind (and never touches another process of the same user), a dead
rank fails the run naming node and rank and takes the other node down quickly, a console that dies
leaves training running and the next console picks it up, a run never starts twice.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from taehv_console.core.run import node as node_tool
from taehv_console.core.run.control import RunController
from taehv_console.core.run.lock import RunBusyError
from taehv_console.core.run.outcome import NothingToResumeError, RunLiveError, WorldSizeChangedError
from taehv_console.core.run.requests import request_stop
from taehv_console.core.run.state import Phase
from tests.core.run.conftest import (
    alive,
    kill_console,
    launch_then_kill_console,
    make_run,
    rank_pid,
    start_console,
    step_of,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)


def test_a_run_that_reaches_max_steps_is_done_and_leaves_nothing(launch_fake):
    ctrl = launch_fake(nodes=2, max_steps=4, step_s=0.1)
    outcome = ctrl.follow(interval=0.1)
    assert outcome.phase is Phase.DONE and outcome.failure is None
    state = ctrl.run.read_state()
    assert state.phase is Phase.DONE and state.attempt.outcome == "done" and state.attempt.ended
    assert [ctrl.run.node_status(i).exit_code for i in (0, 1)] == [0, 0]
    assert all(p == () for p in ctrl.processes().values())
    assert outcome.progress["step"] == 4


def test_a_stop_reports_the_verified_checkpoint_not_the_step_the_stop_events_claim(launch_fake):
    ctrl = launch_fake(nodes=2, step_s=0.2, env={"FAKE_SAVE_FAIL": "1"})
    wait_for(lambda: step_of(ctrl) >= 2, 30, "two steps")
    notes: list[str] = []
    record = ctrl.stop(grace_s=20, on_update=lambda snap: notes.extend(snap.notes))
    claimed = {e["step"] for e in ctrl._tail().progress.stops.values()}
    assert len(claimed) == 1 and claimed.pop() >= 2  # every rank said it stopped at a step ...
    assert record.checkpoint_step is None  # ... but no checkpoint of it verifies, and none is claimed
    assert ctrl.run.read_state().stop.checkpoint_step is None
    assert any("does not verify" in n and "newest verified checkpoint: none" in n for n in notes), notes


def test_stop_checkpoints_the_current_step_and_leaves_nothing_but_spares_other_processes(
    launch_fake, unrelated_sleeper
):
    ctrl = launch_fake(nodes=2, step_s=0.3)
    wait_for(lambda: step_of(ctrl) >= 2, 30, "two steps")
    ranks = [rank_pid(ctrl.run, r) for r in (0, 1)]
    launchers = [n.pid for n in ctrl.attempt.nodes]
    record = ctrl.stop(grace_s=20)
    assert ctrl.state.phase is Phase.STOPPED
    stops = [ctrl._tail().progress.stops[r] for r in (0, 1)]
    assert {s["reason"] for s in stops} == {"signal"}
    assert record.checkpoint_step == stops[0]["step"] >= 2  # the step every rank stopped at
    assert record.verified and record.killed == ()  # they exited on SIGTERM: no SIGKILL needed
    assert not any(alive(p) for p in ranks + launchers)
    assert alive(unrelated_sleeper.pid)
    assert ctrl.run.read_state().stop.checkpoint_step == record.checkpoint_step


def test_ranks_that_ignore_sigterm_are_killed_after_the_grace_in_their_own_sessions(
    launch_fake, unrelated_sleeper
):
    ctrl = launch_fake(nodes=1, per_node=2, step_s=0.2, env={"FAKE_IGNORE_TERM": "1"})
    wait_for(lambda: step_of(ctrl) >= 1, 30, "a step")
    ranks = [rank_pid(ctrl.run, r) for r in (0, 1)]
    # the ranks are not in the launcher's process group: a group-only kill would miss them
    assert all(os.getpgid(p) != ctrl.attempt.nodes[0].pgid for p in ranks)
    t0 = time.time()
    record = ctrl.stop(grace_s=1.5)
    assert time.time() - t0 < 15
    assert record.killed and record.verified and record.checkpoint_step is None
    assert not any(alive(p) for p in ranks)
    assert alive(unrelated_sleeper.pid)


def test_a_killed_rank_fails_the_run_naming_its_node_and_rank_and_stops_the_other_node(launch_fake):
    ctrl = launch_fake(nodes=2, step_s=0.2)
    wait_for(lambda: step_of(ctrl) >= 2, 30, "two steps")
    victim, survivor = rank_pid(ctrl.run, 1), rank_pid(ctrl.run, 0)
    other_launcher = ctrl.attempt.nodes[0].pid
    os.kill(victim, signal.SIGKILL)
    t0 = time.time()
    outcome = ctrl.follow(interval=0.1)
    took = time.time() - t0
    assert outcome.phase is Phase.FAILED
    f = outcome.failure
    assert (f.node, f.host, f.rank, f.exit_code) == (1, "localhost", 1, -9), f
    assert any("Root Cause" in line for line in f.log_lines) and "signal 9" in f.reason
    assert took < 30
    assert not alive(survivor) and not alive(other_launcher)  # the healthy node was stopped too
    assert ctrl.run.read_state().failure.rank == 1


def test_a_rank_error_is_named_with_its_message(launch_fake):
    ctrl = launch_fake(nodes=2, step_s=0.1, env={"FAKE_FAIL_AT": "0:3"})
    outcome = ctrl.follow(interval=0.1)
    assert outcome.phase is Phase.FAILED
    assert outcome.failure.rank == 0 and outcome.failure.node == 0
    assert "injected failure" in outcome.failure.reason


def test_a_launcher_killed_with_its_wrapper_counts_as_vanished(launch_fake, monkeypatch):
    from taehv_console.core.run import control

    monkeypatch.setattr(control, "LIVENESS_EVERY_S", 0.5)
    monkeypatch.setattr(control, "STATUS_LAG_S", 1.0)
    ctrl = launch_fake(nodes=2, step_s=0.2)
    wait_for(lambda: step_of(ctrl) >= 1, 30, "a step")
    gone = ctrl.attempt.nodes[1]
    # the wrapper too: nobody is left to write node 1's exit status
    node_tool.kill_tree(gone.pgid)
    outcome = ctrl.follow(interval=0.1)
    assert outcome.phase is Phase.FAILED and outcome.failure.node == 1
    assert "without an exit status" in outcome.failure.reason
    assert all(p == () for p in ctrl.processes().values())


def test_closing_the_console_keeps_training_and_attach_picks_it_up(tmp_path, pool):
    run = make_run(tmp_path / "runs", nodes=2, max_steps=40)
    launch_then_kill_console(run, max_steps=40, step_s=0.25)
    before = _rank0_step(run)
    time.sleep(1.0)
    assert _rank0_step(run) > before  # the launchers outlived the console that started them

    ctrl = RunController.open(run, pool, purpose="attach")
    try:
        # a second console can neither take the run nor launch it again
        with pytest.raises(RunBusyError, match="another console controls this run"):
            RunController.open(run, pool)
        assert ctrl.reconcile() == "live"
        with pytest.raises(RunLiveError, match="attach"):
            ctrl.launch()
        outcome = ctrl.follow(interval=0.1)
        assert outcome.phase is Phase.DONE and outcome.progress["step"] == 40
        assert len(ctrl.run.read_state().attempts) == 1  # never launched twice
    finally:
        ctrl.close()


def test_attach_after_the_run_ended_without_a_console_concludes_it(tmp_path, pool):
    run = make_run(tmp_path / "runs", nodes=1, max_steps=3)
    console = start_console(run, max_steps=3, step_s=0.05)
    assert console.stdout.readline().strip() == "launched"
    kill_console(console)
    wait_for(lambda: (st := run.node_status(0)) is not None and st.exited, 30, "the launcher to finish")
    # the wrapper records the launcher's exit, then reaps orphans and exits itself: until it has,
    # the node still has a live process and "live" is the right answer
    st = run.node_status(0)
    wait_for(lambda: not node_tool.run_tree(st.pgid, st.start_ticks), 30, "the node's processes to be gone")
    assert run.read_state().phase is Phase.RUNNING  # nobody was there to write the end
    with RunController.open(run, pool) as ctrl:
        assert ctrl.reconcile() == "ended"
        assert ctrl.state.phase is Phase.DONE


def test_stop_from_a_second_console_is_done_by_the_one_in_control(launch_fake, pool):
    ctrl = launch_fake(nodes=2, step_s=0.2)
    result = {}
    follower = threading.Thread(target=lambda: result.update(outcome=ctrl.follow(interval=0.1)))
    follower.start()
    wait_for(lambda: step_of(ctrl) >= 1, 30, "a step")
    state = request_stop(ctrl.run, pool, grace_s=10, wait_s=60)
    follower.join(30)
    assert state.phase is Phase.STOPPED and state.stop.verified
    assert result["outcome"].phase is Phase.STOPPED
    assert "stop requested by" in " ".join(ctrl._notes) or state.stop.reason == "request"
    assert not ctrl.run.stop_request_path.exists()


def test_stop_without_a_console_takes_the_lock_and_stops(tmp_path, pool, unrelated_sleeper):
    run = make_run(tmp_path / "runs", nodes=1, per_node=2)
    console = start_console(run, ranks=2)
    assert console.stdout.readline().strip() == "launched"
    wait_for(lambda: run.event_file(1).exists(), 30, "rank 1 to start")
    kill_console(console)
    state = request_stop(run, pool, grace_s=10)
    assert state.phase is Phase.STOPPED and state.stop.verified and state.stop.reason == "user"
    assert alive(unrelated_sleeper.pid)


def test_a_platform_pod_judges_its_own_ranks_when_a_peers_stop_is_late(tmp_path, pool):
    """Pod 1 controls node 1 only. Its rank stops and its launcher exits while rank 0 (on pod 0)
    is still finalizing the checkpoint: pod 1 must report `stopped`, not a failure."""
    import dataclasses

    from tests.core.run.fake_launcher import fake_commands

    stop_file = tmp_path / "agreed-stop"
    env = {"FAKE_STOP_FILE": str(stop_file), "FAKE_SLOW_STOP": "0:8"}  # longer than STATUS_LAG_S
    run = make_run(tmp_path / "runs", nodes=2, env=env)
    base = dataclasses.replace(run.read_state(), backend="platform")
    pods = []
    for rank in (0, 1):
        state = (
            dataclasses.replace(base, controlled=(rank,))
            if rank
            else dataclasses.replace(base, controlled=(0,))
        )
        ctrl = RunController.open(
            run,
            pool,
            purpose=f"pod {rank}",
            state=state,
            lock_name=None if rank == 0 else f"lock.node-{rank}",
        )
        fake_commands(ctrl, 1, 1000, 0.2)
        ctrl.launch()
        pods.append(ctrl)
    try:
        results = {}
        threads = [
            threading.Thread(target=lambda c=c, i=i: results.update({i: c.follow(interval=0.1)}))
            for i, c in enumerate(pods)
        ]
        for t in threads:
            t.start()
        wait_for(lambda: step_of(pods[0]) >= 2, 30, "two steps")
        stop_file.write_text("")  # every rank agrees to stop (the trainer's collective)
        for t in threads:
            t.join(60)
        assert results[1].phase is Phase.STOPPED, results[1].failure
        assert results[0].phase is Phase.STOPPED, results[0].failure  # node 0 heard rank 1 too
        stops = pods[0]._tail().progress.stops
        assert stops[0]["time"] - stops[1]["time"] > 7  # the race really happened: rank 0 spoke last
        assert run.read_state().controlled == (0,)  # only pod 0 writes state.json
    finally:
        for c in pods:
            c.backend.kill(c.run, c.attempt)
            c.close()


# --------------------------------------------------------------------------------- resume checks


def _fake_checkpoint(run, step: int, world: int) -> None:
    d = run.checkpoints / f"step-{step}"
    d.mkdir(parents=True)
    (d / "weights.safetensors").write_bytes(b"abc")
    (d / "manifest.json").write_text(
        json.dumps({"step": step, "world_size": world, "zero_stage": 2, "files": {"weights.safetensors": 3}})
    )
    (d / "COMPLETE").write_text(f"{step}\n")


def test_resume_at_another_world_size_is_refused_with_both_supported_paths(tmp_path, pool):
    run = make_run(tmp_path / "runs", nodes=1, per_node=2, max_steps=20)
    _fake_checkpoint(run, 4, world=4)
    with RunController.open(run, pool) as ctrl:
        with pytest.raises(WorldSizeChangedError) as err:
            ctrl.resume_point()
        text = str(err.value)
        assert "4 processes" in text and "= 2" in text
        assert "--weights-only" in text and "ds_to_universal" in text and "step-4/ds" in text
        point = ctrl.resume_point(weights_only=True)
        assert (point.spec, point.step) == ("latest", 4)


def test_resume_takes_the_newest_complete_checkpoint_and_reports_skipped_ones(tmp_path, pool):
    run = make_run(tmp_path / "runs", nodes=1, per_node=2, max_steps=20)
    with RunController.open(run, pool) as ctrl:
        with pytest.raises(NothingToResumeError, match="no complete checkpoint"):
            ctrl.resume_point()
        _fake_checkpoint(run, 4, world=2)
        (run.checkpoints / "step-6.tmp").mkdir()
        point = ctrl.resume_point()
        assert point.step == 4 and any("step-6.tmp" in s for s in point.skipped)


def _rank0_step(run) -> int:
    steps = [
        json.loads(line)["step"] for line in run.event_file(0).read_text().splitlines() if '"step"' in line
    ]
    return max(steps, default=0)
