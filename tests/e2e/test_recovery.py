"""Self-healing on the real trainer: `taehv-console --no-tui` runs cpu-smoke (2 DeepSpeed ranks on
gloo, ZeRO-2, generated clips); rank 1 is killed with SIGKILL after the first checkpoint; the
console restarts the run from that checkpoint and it reaches final weights, with the time lost
and the steps redone recorded in state.json and said in the JSON lines."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from taehv_console.core.run.lock import read_holder
from taehv_console.headless import ExitCode
from tests.e2e.consoles import SMALL_RUN, Console, is_step, run_state
from tests.e2e.test_headless import _no_platform_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def cpu_smoke(
    tmp_path,
    max_steps: int,
    checkpoint_every: int,
    *extra: str,
    env: dict | None = None,
    job_control: bool = False,
) -> Console:
    """`--no-tui` on cpu-smoke and generated clips, validating only at the start, 1 s backoff."""
    return Console(
        "--no-tui",
        "--runs",
        tmp_path / "runs",
        "--json",
        "--set",
        f"optim.max_steps={max_steps}",
        "--set",
        f"schedule.checkpoint_every={checkpoint_every}",
        "--set",
        "schedule.val_every=1000",
        "--set",
        "recovery.backoff_s=1",
        *extra,
        *SMALL_RUN,
        env=env if env is not None else _no_platform_env(),
        cwd=tmp_path,
        job_control=job_control,
    )


def rank_1(tmp_path):
    """The run under tmp_path/runs and the pid of its rank 1, from its heartbeat."""
    run = next((tmp_path / "runs").glob("20*"))
    return run, json.loads((run / "heartbeat" / "rank-1.json").read_text())["pid"]


def test_kill_9_of_a_rank_is_restarted_from_the_checkpoint_and_reaches_final_weights(tmp_path):
    console = cpu_smoke(tmp_path, 14, 5)
    console.wait_for(lambda o: is_step(o, 7), 300, "step 7, after the checkpoint at step 5")
    run, victim = rank_1(tmp_path)
    os.kill(victim, signal.SIGKILL)
    rc = console.wait(400)
    assert rc == ExitCode.DONE, console.tail()
    assert (run / "final" / "taehv.safetensors").is_file()
    state = run_state(run)
    first, second = state["attempts"]
    assert (first["cause"], first["decision"], first["outcome"]) == ("signal", "restart", "failed"), first
    assert second["restarted_by"] == "recovery" and second["resume"] == "latest"
    assert second["from_step"] in (5, 10) and second["outcome"] == "done"
    assert second["redone_steps"] == first["reached_step"] - second["from_step"] >= 0
    assert 0 < second["lost_s"] < 180, second
    notes = [o.get("message", "") for o in console.lines if o.get("kind") == "note"]
    assert any("restarting (restart 1 of 3)" in n for n in notes), notes
    assert any(n.startswith("recovered: training again") for n in notes), notes
    print(f"\nkill -9 -> training again: {second['lost_s']} s, {second['redone_steps']} step(s) redone")


def test_the_console_killed_then_a_rank_killed_the_supervisor_heals_the_run_alone(tmp_path):
    """A closed terminal in the middle of a run, then a crash: nobody watches but the supervisor
    the console started, and the run still reaches final weights."""
    env = {**_no_platform_env(), "TAEHV_SUPERVISOR": "on"}
    # 20 steps after the one waited for: the kill comes after the supervisor takes the lock, seconds
    # later, and a step of one micro-batch at 32x32 takes ~0.5 s on a loaded 2-core machine
    console = cpu_smoke(tmp_path, 26, 4, env=env)
    console.wait_for(lambda o: is_step(o, 6), 300, "step 6, after the checkpoint at step 4")
    run, victim = rank_1(tmp_path)
    info = json.loads((run / "supervisor.json").read_text())
    console.kill()  # the terminal closes
    wait = time.time() + 30
    while read_holder(run / "lock").get("purpose") != "supervise" and time.time() < wait:
        time.sleep(0.2)
    assert read_holder(run / "lock").get("purpose") == "supervise"
    os.kill(victim, signal.SIGKILL)
    deadline = time.time() + 400
    while time.time() < deadline and run_state(run)["phase"] != "done":
        time.sleep(1)
    state = run_state(run)
    log = (run / "supervisor.log").read_text()
    assert state["phase"] == "done", log[-3000:]
    assert (run / "final" / "taehv.safetensors").is_file()
    assert [a["decision"] for a in state["attempts"]] == ["restart", ""]
    assert state["attempts"][-1]["restarted_by"] == "recovery" and state["attempts"][-1]["lost_s"] > 0
    assert "took control" in log and "restarting (restart 1 of 3)" in log
    # the supervisor leaves once the run has ended
    deadline = time.time() + 30
    while time.time() < deadline and os.path.exists(f"/proc/{info['pid']}"):
        time.sleep(0.2)
    assert (
        not os.path.exists(f"/proc/{info['pid']}")
        or open(f"/proc/{info['pid']}/stat").read().split()[2] == "Z"
    )


def _state_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_ctrl_z_stops_only_the_console_the_supervisor_heals_the_run_until_fg(tmp_path):
    """`--no-tui` is a client of the run's supervisor: the supervisor holds the run's lock from the
    launch on, the console never does. Ctrl-Z (SIGTSTP) stops the console and nothing else; the
    supervisor restarts a killed rank meanwhile, and the console, shown the restart in its notes,
    follows the run to final weights after `fg` (SIGCONT)."""
    env = {**_no_platform_env(), "TAEHV_SUPERVISOR": "on"}
    # 14 steps after the one waited for: Ctrl-Z, its note and the stopped state come before the kill
    console = cpu_smoke(tmp_path, 20, 4, env=env, job_control=True)
    console.wait_for(lambda o: is_step(o, 6), 300, "step 6, after the checkpoint at step 4")
    run, victim = rank_1(tmp_path)
    assert read_holder(run / "lock").get("purpose") == "supervise"
    console.signal(signal.SIGTSTP)
    note = console.wait_for(
        lambda o: "suspended: the run's supervisor controls it" in o.get("message", ""),
        60,
        "the suspend note",
    )
    assert "`fg` to follow it again" in note["message"]
    deadline = time.time() + 30
    while _state_of(console.proc.pid) != "T" and time.time() < deadline:
        time.sleep(0.2)
    assert _state_of(console.proc.pid) == "T"  # stopped, as Ctrl-Z leaves a job
    os.kill(victim, signal.SIGKILL)
    deadline = time.time() + 300
    while time.time() < deadline and len(run_state(run)["attempts"]) < 2:
        time.sleep(0.5)
    assert run_state(run)["attempts"][0]["decision"] == "restart", run_state(run)["attempts"]
    assert read_holder(run / "lock").get("purpose") == "supervise"
    console.signal(signal.SIGCONT)  # fg
    console.wait_for(lambda o: o.get("message") == "continued", 60, "the fg note")
    rc = console.wait(400)
    assert rc == ExitCode.DONE, console.tail()
    state = run_state(run)
    assert state["phase"] == "done" and (run / "final" / "taehv.safetensors").is_file()
    assert [a["decision"] for a in state["attempts"]] == ["restart", ""]
    notes = [o.get("message", "") for o in console.lines if o.get("kind") == "note"]
    assert any("restarting (restart 1 of 3)" in n for n in notes), notes  # the supervisor's, shown here
    assert console.result()["exit_code"] == ExitCode.DONE


def test_ctrl_c_on_a_supervised_run_is_a_stop_the_supervisor_carries_out_and_resume_hands_it_back(tmp_path):
    """Ctrl-C on `--no-tui` as users run it: the console asks the run's supervisor to stop the run
    (stop.request), the supervisor checkpoints and stops it, and the console exits 4 (stopped).
    `resume` takes the run's lock for the launch only, hands the run to a new supervisor and
    follows it as its client; its Ctrl-C stops it again, with the grace `resume --grace` gave."""
    env = {**_no_platform_env(), "TAEHV_SUPERVISOR": "on"}
    console = cpu_smoke(tmp_path, 1000, 1000, env=env)
    console.wait_for(lambda o: is_step(o, 2), 300, "step 2")
    run, _ = rank_1(tmp_path)
    first = json.loads((run / "supervisor.json").read_text())["pid"]
    assert read_holder(run / "lock").get("purpose") == "supervise"
    console.signal(signal.SIGINT)
    rc = console.wait(300)
    assert rc == ExitCode.STOPPED, console.tail()
    notes = [o.get("message", "") for o in console.lines if o.get("kind") == "note"]
    assert "stop asked of the run's supervisor" in notes, notes
    state = run_state(run)
    stopped_at = state["stop"]["checkpoint_step"]
    assert state["phase"] == "stopped" and stopped_at is not None and state["stop"]["verified"]
    assert "stop requested by" in (run / "supervisor.log").read_text()
    assert not (run / "stop.request").exists()
    resumed = Console(
        "resume",
        run,
        "--json",
        "--grace",
        "60",
        env=env,
        cwd=tmp_path,
    )
    resumed.wait_for(lambda o: is_step(o, stopped_at + 1), 300, "a step after the resume")
    second = json.loads((run / "supervisor.json").read_text())["pid"]
    assert second != first and read_holder(run / "lock").get("purpose") == "supervise"
    resumed.signal(signal.SIGINT)
    assert resumed.wait(300) == ExitCode.STOPPED, resumed.tail()
    state = run_state(run)
    assert [a["outcome"] for a in state["attempts"]] == ["stopped", "stopped"]
    assert state["attempts"][1]["from_step"] == stopped_at
    assert state["stop"]["grace_s"] == 60  # the resuming console's --grace reached the supervisor


def test_a_sigstopped_rank_is_named_its_stack_taken_then_the_run_restarted_and_done(tmp_path):
    """A hang: rank 1 stops (SIGSTOP) and never comes back. The stall is named with its stack
    (forensics), the attempt is ended at recovery.stall_restart_after_s instead of at the
    collective timeout (300 s on cpu-smoke), and the restart reaches final weights."""
    console = cpu_smoke(tmp_path, 14, 5, "--set", "recovery.stall_restart_after_s=20")
    console.wait_for(lambda o: is_step(o, 7), 300, "step 7, after the checkpoint at step 5")
    run, victim = rank_1(tmp_path)
    t_stop = time.time()
    os.kill(victim, signal.SIGSTOP)
    console.wait_for(
        lambda o: o.get("kind") == "forensics" and o.get("rank") == 1, 120, "the stack of rank 1"
    )
    rc = console.wait(400)
    assert rc == ExitCode.DONE, console.tail()
    state = run_state(run)
    assert len(state["attempts"]) == 2, state["attempts"]
    first, second = state["attempts"]
    assert (first["cause"], first["decision"], first["blamed_node"]) == ("stall", "restart", 0), first
    assert "stalled for" in first["why"]
    assert "trainer/" in first["why"].split("stalled for")[1], first  # where, from its stack
    assert first["ended"] - t_stop < 120  # not the collective timeout
    assert second["outcome"] == "done" and second["restarted_by"] == "recovery"
    assert (run / "final" / "taehv.safetensors").is_file()
    assert list((run / "forensics").glob("report-rank-1-*.json"))
    print(f"\nSIGSTOP -> training again: {second['lost_s']} s, {second['redone_steps']} step(s) redone")
