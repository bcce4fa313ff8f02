"""Two simulated nodes (127.0.0.2 and 127.0.0.3, reached through the real sshd fixture) running one
real CPU DeepSpeed training across both (gloo over loopback, machine ranks 0 and 1, the main
process on 127.0.0.2), driven through `taehv-console` exactly as a user would.

Two runs, each shared by several tests (a module-scoped fixture plays the story once and records
what happened; the tests assert on it):
- lifecycle: launch headless -> the console is killed mid-run -> training goes on -> a launch
  while live is refused -> `attach` reconnects and shows progress -> a second launch while
  attached is refused -> `stop` (asks the attached console) -> checkpoint at the current step,
  nothing of the run left on either node, an unrelated sleeping process of the same user alive ->
  `resume` runs to the end with final/ weights.
- failure: kill -9 of rank 1 on 127.0.0.3 -> failed naming node 1 / rank 1 within 30 s, node 0's
  processes gone -> `resume` continues from the last complete checkpoint to the end.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from taehv_console.core.cluster.ssh import SshPool
from taehv_console.headless import ExitCode
from tests.e2e.consoles import (
    SMALL_RUN,
    Console,
    events,
    free_port,
    is_step,
    pid_alive_on,
    run_cli,
    run_state,
    tree_on,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

HOSTS = ["127.0.0.2", "127.0.0.3"]


def _env(sshd) -> dict:
    # the console finds the nodes through the fixture's ssh config and known_hosts only
    return {**os.environ, **sshd.env()}


def _launch_args(work: Path, sshd, max_steps: int, *extra: str) -> list[str]:
    hostfile = sshd.write_hostfile(work / "hostfile", slots=1, hosts=HOSTS)
    return [
        "--no-tui",
        "--hosts",
        str(hostfile),
        "--runs",
        str(work / "runs"),
        "--master-port",
        str(free_port()),
        "--json",
        "--set",
        f"optim.max_steps={max_steps}",
        "--set",
        "schedule.val_every=1000",
        *SMALL_RUN,
        *extra,
    ]


def _run_dir(console: Console, work: Path) -> Path:
    phase = console.wait_for(lambda o: o.get("kind") == "phase", 240, "the run to start")
    return work / "runs" / phase["run"]


def _nothing_left(pool: SshPool, run: Path, attempt: int = -1) -> dict[str, list[int]]:
    """Per node: what is left of the attempt's launcher tree, and which of its ranks still live."""
    state = run_state(run)
    a = state["attempts"][attempt]
    left = {}
    for n in a["nodes"]:
        runner = pool.runner(n["host"])
        left[n["host"]] = tree_on(runner, n["pgid"], node=n, run_id=state["run_id"])
    for r in (0, 1):
        beat = run / "heartbeat" / f"rank-{r}.json"
        if beat.exists():
            import json

            b = json.loads(beat.read_text())
            host = HOSTS[r]  # one rank per node: rank r runs on node r
            if pid_alive_on(pool.runner(host), b["pid"]):
                left.setdefault(host, []).append(b["pid"])
    return left


# ------------------------------------------------------------------------------------ lifecycle


@pytest.fixture(scope="module")
def lifecycle(sshd, tmp_path_factory):
    work = tmp_path_factory.mktemp("lifecycle")
    env = _env(sshd)
    seen: dict = {}
    # rank 0 sleeps 1.5 s per step: slow enough that the story below happens mid-run
    first = Console(
        *_launch_args(
            work, sshd, 20, "--set", "schedule.checkpoint_every=1000", "--env", "TAEHV_FAULTS=delay:0:*:1.5"
        ),
        env=env,
        cwd=work,
    )
    run = _run_dir(first, work)
    seen["run"] = run
    first.wait_for(lambda o: is_step(o, 2), 300, "step 2")
    first.kill()
    seen["step_at_kill"] = at_kill = max(e["step"] for e in events(run, 0, "step"))
    deadline = time.time() + 60
    while max(e["step"] for e in events(run, 0, "step")) <= at_kill and time.time() < deadline:
        time.sleep(0.5)
    seen["step_after_kill"] = max(e["step"] for e in events(run, 0, "step"))

    seen["resume_while_live"] = run_cli("resume", run, env=env, cwd=work)

    attach = Console("attach", run, "--json", env=env, cwd=work)
    after = seen["step_after_kill"]
    seen["attach_step"] = attach.wait_for(lambda o: is_step(o, after + 1), 120, "progress after attach")
    seen["attach_note"] = attach.wait_for(
        lambda o: "attached to" in str(o.get("message", "")), 5, "attach note"
    )
    seen["resume_while_attached"] = run_cli("resume", run, env=env, cwd=work)
    seen["headless_while_attached"] = run_cli(
        *_launch_args(work, sshd, 20)[:5], "--run", run, "--json", env=env, cwd=work
    )

    with SshPool(sshd.settings()) as pool:
        node1 = pool.runner(HOSTS[1])
        sleeper = node1.start_detached(["sleep", "900"], log_path=str(work / "sleeper.log"))
        seen["sleeper"] = sleeper
        t0 = time.time()
        seen["stop"] = run_cli("stop", run, "--json", env=env, cwd=work, timeout=300)
        seen["stop_seconds"] = time.time() - t0
        seen["attach_rc"] = attach.wait(120)
        seen["attach_result"] = attach.result()
        seen["state_after_stop"] = run_state(run)
        seen["left_after_stop"] = _nothing_left(pool, run)
        seen["sleeper_alive"] = pid_alive_on(node1, sleeper.pid)
        node1.signal_group(sleeper, "KILL")

    from trainer import checkpoint as ckpt

    seen["newest_after_stop"] = ckpt.scan(run / "checkpoints").newest
    seen["stops"] = [events(run, r, "stop")[-1] for r in (0, 1)]

    resume = Console("resume", run, "--json", "--env", "TAEHV_FAULTS=", env=env, cwd=work)
    seen["resume_rc"] = resume.wait(600)
    seen["resume_result"] = resume.result()
    seen["resume_lines"] = resume.lines
    seen["state_at_end"] = run_state(run)
    return seen


def test_killing_the_console_does_not_stop_training(lifecycle):
    assert lifecycle["step_after_kill"] > lifecycle["step_at_kill"]


def test_a_launch_while_the_run_is_live_is_refused(lifecycle):
    r = lifecycle["resume_while_live"]
    assert r.returncode == ExitCode.BUSY and "attach" in r.stderr
    assert len(lifecycle["state_at_end"]["attempts"]) == 2  # the refused ones started nothing


def test_attach_reconnects_and_shows_progress(lifecycle):
    assert lifecycle["attach_step"]["step"] > lifecycle["step_after_kill"]
    assert (
        "127.0.0.2" in lifecycle["attach_note"]["message"]
        and "127.0.0.3" in lifecycle["attach_note"]["message"]
    )


def test_a_second_launch_while_a_console_is_attached_is_refused(lifecycle):
    for key in ("resume_while_attached", "headless_while_attached"):
        r = lifecycle[key]
        assert r.returncode == ExitCode.BUSY, (key, r.stdout[-2000:], r.stderr[-2000:])
        assert "another console controls this run" in (r.stderr + r.stdout)


def test_stop_checkpoints_the_current_step_and_leaves_nothing_on_either_node(lifecycle):
    stop = lifecycle["stop"]
    assert stop.returncode == 0, stop.stderr
    stops = lifecycle["stops"]
    assert all(s["reason"] == "signal" and s["exit_status"] == 0 for s in stops)
    step = stops[0]["step"]
    assert stops[1]["step"] == step
    state = lifecycle["state_after_stop"]
    assert state["phase"] == "stopped" and state["stop"]["checkpoint_step"] == step
    assert state["stop"]["verified"] and state["stop"]["killed"] == []
    assert lifecycle["newest_after_stop"].step == step
    assert lifecycle["left_after_stop"] == {"127.0.0.2": [], "127.0.0.3": []}
    # the attached console carried out the stop and ended with the STOPPED exit code
    assert lifecycle["attach_rc"] == ExitCode.STOPPED
    assert lifecycle["attach_result"]["stop"]["checkpoint_step"] == step


def test_stop_spares_an_unrelated_process_of_the_same_user_on_the_node(lifecycle):
    assert lifecycle["sleeper_alive"]


def test_two_nodes_train_to_completion_with_final_weights(lifecycle):
    """Both nodes run the (resumed) training to max_steps; the weights load without DeepSpeed."""
    from safetensors.torch import load_file

    assert lifecycle["resume_rc"] == ExitCode.DONE, [str(x)[:300] for x in lifecycle["resume_lines"][-10:]]
    run = lifecycle["run"]
    state = lifecycle["state_at_end"]
    assert state["phase"] == "done" and state["attempts"][-1]["resume"] == "latest"
    assert {n["host"] for n in state["attempts"][-1]["nodes"]} == set(HOSTS)
    starts = [events(run, r, "start")[-1] for r in (0, 1)]
    assert all(s["world_size"] == 2 for s in starts) and {s["node"] for s in starts}
    stopped_at = lifecycle["stops"][0]["step"]
    assert starts[0]["resumed_from"].endswith(f"step-{stopped_at}")
    steps = [e["step"] for e in events(run, 0, "step")]
    assert steps[-1] == 20 and steps[steps.index(stopped_at) + 1] == stopped_at + 1
    assert all(e["reason"] == "done" for e in (events(run, r, "stop")[-1] for r in (0, 1)))
    weights = load_file(str(run / "final" / "taehv.safetensors"))
    assert len(weights) > 100 and lifecycle["resume_result"]["final_weights"].endswith("taehv.safetensors")


# -------------------------------------------------------------------------------------- failure


@pytest.fixture(scope="module")
def failure(sshd, tmp_path_factory):
    work = tmp_path_factory.mktemp("failure")
    env = _env(sshd)
    seen: dict = {}
    console = Console(
        *_launch_args(
            work,
            sshd,
            8,
            "--set",
            "schedule.checkpoint_every=2",
            # this story is the diagnosis and a resume by hand: the console's own restarts are off
            "--set",
            "recovery.max_restarts=0",
            "--env",
            "TAEHV_FAULTS=delay:0:*:1",
        ),
        env=env,
        cwd=work,
    )
    run = _run_dir(console, work)
    seen["run"] = run
    console.wait_for(
        lambda o: (
            o.get("source") == "trainer"
            and o.get("kind") == "checkpoint"
            and o.get("status") == "complete"
            and o.get("rank") == 0
        ),
        300,
        "the first checkpoint",
    )
    import json

    victim = json.loads((run / "heartbeat" / "rank-1.json").read_text())["pid"]
    with SshPool(sshd.settings()) as pool:
        node1 = pool.runner(HOSTS[1])
        t_kill = time.time()
        assert node1.run(["kill", "-9", str(victim)]).exit_status == 0  # on rank 1's node, by its pid
        seen["rc"] = console.wait(120)
        seen["seconds_to_result"] = console.result()["_seen"] - t_kill
        seen["state"] = run_state(run)
        seen["seconds_to_failed"] = seen["state"]["failure"]["detected"] - t_kill
        seen["left"] = _nothing_left(pool, run)
    from trainer import checkpoint as ckpt

    seen["newest_at_failure"] = ckpt.scan(run / "checkpoints").newest.step
    seen["result"] = console.result()
    resume = Console("resume", run, "--json", "--env", "TAEHV_FAULTS=", env=env, cwd=work)
    seen["resume_rc"] = resume.wait(600)
    seen["resume_lines"] = resume.lines
    seen["state_at_end"] = run_state(run)
    return seen


def test_a_killed_rank_fails_the_run_naming_node_and_rank_within_30_s(failure):
    assert failure["rc"] == ExitCode.TRAINING_FAILED
    f = failure["state"]["failure"]
    assert (f["node"], f["host"], f["rank"], f["exit_code"]) == (1, "127.0.0.3", 1, -9), f
    assert any("Root Cause (first observed failure)" in line for line in f["log_lines"])
    assert failure["seconds_to_failed"] < 30 and failure["seconds_to_result"] < 30
    assert failure["result"]["failure"]["rank"] == 1


def test_after_a_failure_the_other_nodes_processes_are_gone(failure):
    assert failure["left"] == {"127.0.0.2": [], "127.0.0.3": []}
    assert failure["state"]["attempts"][-1]["outcome"] == "failed"


def test_resume_after_a_failure_continues_from_the_last_complete_checkpoint_to_the_end(failure):
    assert failure["resume_rc"] == ExitCode.DONE, [str(x)[:300] for x in failure["resume_lines"][-10:]]
    run = failure["run"]
    start = events(run, 0, "start")[-1]
    assert start["resumed_from"].endswith(f"step-{failure['newest_at_failure']}")
    resumed_steps = [e["step"] for e in events(run, 0, "step") if e["time"] >= start["time"]]
    assert resumed_steps == list(range(failure["newest_at_failure"] + 1, 9))
    assert (run / "final" / "taehv.safetensors").is_file()
    assert failure["state_at_end"]["phase"] == "done" and failure["state_at_end"]["failure"] is None
