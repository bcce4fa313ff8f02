"""Recovery on real processes: fake torchrun launchers (tests/core/run/fake_launcher.py) whose ranks
checkpoint, die and resume from the newest verified checkpoint, followed by the real controller,
with a real HTTP server on loopback receiving the notifications."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from taehv_console.core.run.notify import Notifier
from taehv_console.core.run.recovery import recoveries
from taehv_console.core.run.state import Phase
from taehv_console.exit_codes import ExitCode, exit_code_for
from tests.core.run.conftest import rank_pid, step_of, wait_for
from trainer.config import NotifySection

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def webhook():
    """A loopback HTTP server that records every JSON body POSTed to it."""
    received: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    server.shutdown()


def recovering(*extra: str) -> tuple[str, ...]:
    return ("recovery.max_restarts=2", "recovery.backoff_s=0.5", *extra)


def test_a_rank_killed_with_sigkill_is_restarted_from_its_checkpoint_and_the_run_reaches_done(
    launch_fake, webhook
):
    url, received = webhook
    ctrl = launch_fake(
        nodes=1,
        per_node=2,
        max_steps=14,
        step_s=0.2,
        env={"FAKE_CKPT_EVERY": "3"},
        overrides=recovering(f"notify.webhook={url}"),
    )
    wait_for(lambda: step_of(ctrl) >= 7, 60, "step 7, after two checkpoints")
    os.kill(rank_pid(ctrl.run, 1), signal.SIGKILL)
    notes: list[str] = []
    outcome = ctrl.follow(lambda snap: notes.extend(snap.notes), interval=0.1)
    assert outcome.phase is Phase.DONE and outcome.progress["step"] == 14, notes
    first, second = ctrl.run.read_state().attempts
    assert (first.outcome, first.cause, first.decision, first.blamed_node) == (
        "failed",
        "signal",
        "restart",
        0,
    )
    assert first.reached_step >= 7
    assert second.restarted_by == "recovery" and second.resume == "latest" and second.outcome == "done"
    # resumed from the newest checkpoint: 6 (or 9 if the kill came after it), redoing the steps since
    assert second.from_step in (6, 9) and second.redone_steps == first.reached_step - second.from_step
    assert 0 < second.lost_s < 30, second.lost_s
    (r,) = recoveries(ctrl.run.read_state().attempts)
    # the time lost, split: the failure named, the attempt torn down, training again
    assert r.detect_s is not None and r.teardown_s is not None and r.relaunch_s is not None
    assert r.detect_s >= 0 and r.teardown_s >= 0 and r.relaunch_s >= 0.5  # the backoff is in it
    assert abs(r.detect_s + r.teardown_s + r.relaunch_s - second.lost_s) < 0.5
    assert any("restarting (restart 1 of 2)" in n for n in notes) and any("recovered:" in n for n in notes)
    assert ctrl.notifier.flush(10)
    kinds = [e["event"] for e in received]
    assert kinds == ["launched", "restarting", "recovered", "done"], received
    assert all(e["text"].startswith(f"taehv run {ctrl.run.run_id}:") for e in received)
    assert exit_code_for(outcome.phase, outcome.final) is ExitCode.DONE


def test_a_trainer_error_that_would_repeat_fails_at_once_without_a_restart(launch_fake):
    ctrl = launch_fake(nodes=1, per_node=2, max_steps=50, env={"FAKE_FAIL_AT": "1:3"}, overrides=recovering())
    outcome = ctrl.follow(interval=0.1)
    state = ctrl.run.read_state()
    assert outcome.phase is Phase.FAILED and len(state.attempts) == 1
    assert (state.attempt.cause, state.attempt.decision) == ("exception", "fail")
    assert "injected failure" in state.attempt.why and "would fail the same way again" in state.attempt.why
    assert outcome.final and exit_code_for(outcome.phase, outcome.final) is ExitCode.FAILED_FINAL


def test_a_fault_that_comes_back_without_progress_gives_up_with_the_do_not_retry_code(launch_fake, webhook):
    url, received = webhook
    # rank 0 kills itself at step 5 on every attempt: the first attempt checkpoints step 3, the
    # next ones resume there, train step 4 (rank 0's own step event: each one trains again, however
    # slow the machine) and die again before a new checkpoint
    ctrl = launch_fake(
        nodes=1,
        per_node=2,
        max_steps=50,
        step_s=0.1,
        env={"FAKE_CKPT_EVERY": "3", "FAKE_DIE_AT": "0:5"},
        overrides=("recovery.max_restarts=5", "recovery.backoff_s=0.2", f"notify.webhook={url}"),
    )
    outcome = ctrl.follow(interval=0.1)
    attempts = ctrl.run.read_state().attempts
    assert outcome.phase is Phase.FAILED and outcome.final
    assert [a.decision for a in attempts] == ["restart", "restart", "give-up"]
    assert [a.from_step for a in attempts] == [0, 3, 3]
    assert "two attempts in a row added no checkpoint" in attempts[-1].why
    assert exit_code_for(outcome.phase, outcome.final) is ExitCode.FAILED_FINAL
    assert ctrl.notifier.flush(10)
    assert [e["event"] for e in received] == [
        "launched",
        "restarting",
        "recovered",
        "restarting",
        "recovered",
        "gave-up",
    ], received


def test_the_budget_spent_gives_up(launch_fake):
    ctrl = launch_fake(
        nodes=1,
        per_node=2,
        max_steps=60,
        step_s=0.1,
        env={"FAKE_CKPT_EVERY": "2", "FAKE_DIE_AT": "1:5"},
        overrides=("recovery.max_restarts=1", "recovery.backoff_s=0.2"),
    )
    outcome = ctrl.follow(interval=0.1)
    attempts = ctrl.run.read_state().attempts
    assert [a.decision for a in attempts] == ["restart", "give-up"]
    assert "1 of 1 used" in attempts[-1].why and outcome.final


def test_a_stop_during_the_backoff_cancels_the_restart(launch_fake):
    ctrl = launch_fake(
        nodes=1,
        per_node=2,
        max_steps=50,
        step_s=0.1,
        env={"FAKE_CKPT_EVERY": "2", "FAKE_DIE_AT": "1:5"},
        overrides=("recovery.max_restarts=3", "recovery.backoff_s=30"),
    )
    asked = threading.Event()

    def on_update(snap):
        if snap.phase is Phase.RECOVERING:
            asked.set()

    outcome = ctrl.follow(on_update, should_stop=asked.is_set, interval=0.1)
    state = ctrl.run.read_state()
    assert outcome.phase is Phase.STOPPED and len(state.attempts) == 1
    # the newest checkpoint that verifies: rank 0 may have been killed while it finalised step 4
    assert state.stop.checkpoint_step in (2, 4) and not ctrl.live_nodes()
    assert not any(a.restarted_by for a in state.attempts) and state.attempt.decision == "restart"


def test_notify_command_gets_the_event_on_stdin_and_a_failing_target_is_said_once(tmp_path):
    out = tmp_path / "events.jsonl"
    script = tmp_path / "hook.py"
    script.write_text(f"import sys\nopen({str(out)!r}, 'a').write(sys.stdin.read() + '\\n')\n")
    notes: list[str] = []
    good = Notifier(NotifySection(command=f"{sys.executable} {script}"), "run-x", note=notes.append)
    good.send("failed", "taehv run run-x: rank 1 died", rank=1)
    assert good.flush(20)
    event = json.loads(out.read_text().splitlines()[0])
    assert (event["event"], event["run"], event["rank"]) == ("failed", "run-x", 1) and "rank 1 died" in event[
        "text"
    ]
    # nothing listens on this port: three tries, then one note, and sending never blocks
    bad = Notifier(NotifySection(webhook="http://127.0.0.1:9/x", timeout_s=1), "run-x", note=notes.append)
    bad.send("failed", "a")
    bad.send("done", "b")
    assert bad.flush(30)
    assert len([n for n in notes if "notify.webhook failed" in n]) == 1, notes


def test_a_stall_past_the_bound_ends_the_attempt_and_an_earlier_attempts_heartbeat_does_not(launch_fake):
    """The watch's stalled ranks reach the controller as Stall values; one whose heartbeat is older
    than the attempt (a rank of the attempt before, not yet replaced) is not this attempt's stall."""
    from taehv_console.core.run.recovery import Stall

    ctrl = launch_fake(
        nodes=1, per_node=2, max_steps=400, step_s=0.1, overrides=("recovery.stall_restart_after_s=0.5",)
    )
    wait_for(lambda: step_of(ctrl) >= 2, 30, "two steps")
    started = ctrl.attempt.started
    old = [Stall(rank=1, node="n", stalled_s=time.time() - started + 30, forensics=True)]
    assert not ctrl._check_stalls(lambda: old, time.time())
    wait_for(lambda: time.time() - started > 2, 10, "two seconds into the attempt")
    young = [Stall(rank=1, node="n", stalled_s=0.3, forensics=True)]
    assert not ctrl._check_stalls(lambda: young, time.time())  # under the bound
    where = "wait (threading.py:331), called from next_batch (trainer/data.py:412)"
    stalled = [Stall(rank=1, node="n", stalled_s=1.0, forensics=True, where=where)]
    assert ctrl._check_stalls(lambda: stalled, time.time())
    state = ctrl.run.read_state()
    assert state.phase is Phase.FAILED and state.failure.kind == "stall" and state.failure.rank == 1
    # where it hangs is in the failure, so in the attempt's why and the "stalled" notification
    assert f"stalled for 1 s (the bound is 0 s) in {where}; its stack" in state.failure.reason
    assert not ctrl.live_nodes()


def test_ranks_that_all_stopped_cleanly_are_not_a_failure_while_a_launcher_lingers(launch_fake):
    """A SIGTERM to node 0's launcher alone (a platform deleting pod 0): every rank agrees to stop
    and checkpoints, node 0's launcher exits 1 (torchrun, signalled), node 1's is still in its exit
    barrier for a few seconds. The ranks' words are the verdict: stopped, not failed (and so
    nothing to restart). Before, the exit 1 read as a failure once the 2 s settle had passed."""
    ctrl = launch_fake(
        nodes=2,
        per_node=1,
        step_s=0.2,
        env={"FAKE_LINGER": "1:4"},
        overrides=("recovery.max_restarts=2", "recovery.backoff_s=0.5"),
    )
    wait_for(lambda: step_of(ctrl) >= 2, 30, "two steps")
    os.killpg(ctrl.attempt.nodes[0].pgid, signal.SIGTERM)
    outcome = ctrl.follow(interval=0.1)
    assert outcome.phase is Phase.STOPPED, (outcome.failure, ctrl.run.read_state().attempts)
    assert len(ctrl.run.read_state().attempts) == 1 and outcome.stop.by == "outside the console"


def test_the_watchs_hardware_evidence_makes_a_killed_rank_a_device_fault_on_its_node(launch_fake):
    # the agent saw node 0's GPU 1 fall off the bus; then rank 1 died: the node's GPU is the cause
    ctrl = launch_fake(
        nodes=1, per_node=2, max_steps=12, step_s=0.2, env={"FAKE_CKPT_EVERY": "3"}, overrides=recovering()
    )
    wait_for(lambda: step_of(ctrl) >= 4, 60, "step 4, after the checkpoint")
    os.kill(rank_pid(ctrl.run, 1), signal.SIGKILL)
    asked: list[int] = []

    def hardware() -> dict[str, str]:
        asked.append(1)
        return {"localhost": "GPU 1: GPU is lost", "elsewhere": "GPU 0: 2 uncorrectable ECC errors"}

    outcome = ctrl.follow(interval=0.1, hardware=hardware)
    first = ctrl.run.read_state().attempts[0]
    assert asked and outcome.phase is Phase.DONE
    assert (first.cause, first.blamed_node, first.decision) == ("device", 0, "restart"), first
    assert "hardware evidence on node 0: GPU 1: GPU is lost" in first.why
    # the local backend cannot start the run without its node: it restarts and says why
    assert "stays in (the backend cannot relaunch without a node)" in first.why


def test_a_relaunch_finds_the_rendezvous_port_taken_on_node_0_and_moves_to_a_free_one(
    launch_fake, monkeypatch
):
    """Two nodes on this machine: after rank 1 is killed, another process holds the run's port
    (the fake launchers never listen on it). The relaunch waits for it a while, then moves to the
    next free port, writes it into every node's launch file, and the run reaches done."""
    import taehv_console.core.run.recovering as recovering_module
    from tests.e2e.consoles import PortHolder

    monkeypatch.setattr(recovering_module, "PORT_WAIT_S", 1.0)
    ctrl = launch_fake(
        nodes=2, per_node=1, max_steps=12, step_s=0.2, env={"FAKE_CKPT_EVERY": "3"}, overrides=recovering()
    )
    port = ctrl.state.master_port
    holder = PortHolder(port)
    try:
        assert holder.taken.wait(10), f"port {port} is not free on this machine"
        wait_for(lambda: step_of(ctrl) >= 4, 60, "step 4, after a checkpoint")
        os.kill(rank_pid(ctrl.run, 1), signal.SIGKILL)
        notes: list[str] = []
        outcome = ctrl.follow(lambda snap: notes.extend(snap.notes), interval=0.1)
    finally:
        holder.close()
    assert outcome.phase is Phase.DONE, notes
    moved = ctrl.run.read_state().master_port
    assert moved > port, (port, moved)
    assert any(f"the rendezvous port {port} is taken on node 0 (localhost)" in n for n in notes), notes
    for node in (0, 1):
        assert f"main_process_port: {moved}" in (ctrl.run.path / f"accelerate-node-{node}.yaml").read_text()
