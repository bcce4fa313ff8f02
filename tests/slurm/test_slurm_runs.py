"""cpu-smoke across the two nodes of a real SLURM cluster (tests/slurm/cluster.py), driven through
`taehv-console` as a user runs it: submitted with sbatch from the login node, and launched by a
console running inside an allocation (salloc). One CPU process per node: 2 ranks, gloo between
n1 (127.0.0.2) and n2 (127.0.0.3).

The sbatch story (one module fixture, several tests): another job sleeps on both nodes; the run is
submitted, stopped mid-run (SIGTERM to the console), then resumed with sbatch to its final weights.

Inside an allocation: a run to final weights; a rank killed and the srun step relaunched on both
nodes; a rank killed and its node left out, the next srun step on the other node alone.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from taehv_console.headless import ExitCode
from tests.e2e.consoles import (
    SMALL_RUN,
    Console,
    PortHolder,
    cli_argv,
    events,
    free_port,
    is_step,
    run_cli,
    run_state,
)
from trainer import checkpoint as ckpt
from trainer.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _args(work: Path, max_steps: int, *extra: str) -> list[str]:
    return [
        "--no-tui",
        "--runs",
        str(work / "runs"),
        "--master-port",
        str(free_port()),
        "--json",
        "--preset",
        "cpu-smoke",
        "--set",
        "topology.nodes=2",
        "--set",
        "topology.gpus_per_node=1",
        "--set",
        f"optim.max_steps={max_steps}",
        "--set",
        "schedule.val_every=1000",
        "--set",
        "schedule.checkpoint_every=1000",
        *SMALL_RUN,
        *extra,
    ]


def _run_dir(console: Console, work: Path) -> Path:
    try:
        line = console.wait_for(lambda o: o.get("kind") == "phase", 240, "the run to start")
    except AssertionError:
        console.wait(30)
        raise AssertionError(f"{console.tail()}\n{console.stderr[-3000:]}") from None
    return work / "runs" / line["run"]


def _finished_with_weights(rc: int, console: Console, run: Path) -> None:
    from safetensors.torch import load_file

    assert rc == ExitCode.DONE, console.tail()
    result = console.result()
    assert result["phase"] == "done" and result["final_weights"].endswith("final/taehv.safetensors")
    assert len(load_file(str(run / "final" / "taehv.safetensors"))) > 100
    starts = [events(run, r, "start")[-1] for r in (0, 1)]
    assert all(s["world_size"] == 2 for s in starts)
    assert all(e["reason"] == "done" for e in (events(run, r, "stop")[-1] for r in (0, 1)))
    # one launcher per SLURM node, each under the node wrapper, with this attempt's number
    attempt = len(run_state(run)["attempts"])
    for node in (0, 1):
        st = json.loads((run / "logs" / f"node-{node}.status.json").read_text())
        assert st["node"] == node and st["attempt"] == attempt


def _alive(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# ---------------------------------------------------------------------------------- sbatch story


@pytest.fixture(scope="module")
def sbatch_story(slurm_cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("sbatch")
    env = slurm_cluster.client_env()
    seen: dict = {}
    # another user's job on the same two nodes (OverSubscribe=FORCE lets both run), one task per
    # node recording its pid
    pids = work / "neighbour"
    pids.mkdir()
    neighbour = slurm_cluster.run(
        "sbatch",
        "--parsable",
        "--nodes=2",
        "--job-name=neighbour",
        f"--output={work}/neighbour.out",
        "--wrap",
        f"srun --nodes=2 --ntasks-per-node=1 bash -c 'echo $$ > {pids}/$SLURM_NODEID; exec sleep 900'",
    ).stdout.strip()
    seen["neighbour"] = neighbour
    slurm_cluster.wait_job_state(neighbour, {"RUNNING"}, 60)
    deadline = time.time() + 60
    while len(list(pids.iterdir())) < 2 and time.time() < deadline:
        time.sleep(0.2)
    seen["neighbour_pids"] = [int(p.read_text()) for p in sorted(pids.iterdir())]

    # rank 0 sleeps 3 s a step: slow enough that the stop lands mid-run
    first = Console(
        *_args(work, 3, "--backend", "sbatch", "--env", "TAEHV_FAULTS=delay:0:*:3"), env=env, cwd=work
    )
    run = _run_dir(first, work)
    seen["run"] = run
    first.wait_for(lambda o: is_step(o, 1), 400, "step 1")
    job = run_state(run)["attempts"][-1]["slurm_job"]
    seen["job_nodes"] = slurm_cluster.job_field(job, "NodeList")
    beats = [run / "heartbeat" / f"rank-{r}.json" for r in (0, 1)]
    deadline = time.time() + 60
    while not all(b.exists() for b in beats) and time.time() < deadline:  # rank 1's may trail rank 0's step
        time.sleep(0.2)
    seen["heartbeat_pids"] = [json.loads(b.read_text())["pid"] for b in beats]
    t0 = time.time()
    first.signal(signal.SIGTERM)
    seen["stop_rc"] = first.wait(300)
    seen["stop_seconds"] = time.time() - t0
    seen["stop_result"] = first.result()
    seen["state_after_stop"] = run_state(run)
    seen["job_state_after_stop"] = slurm_cluster.job_field(job, "JobState")
    seen["ranks_left"] = [p for p in seen["heartbeat_pids"] if _alive(p)]
    seen["neighbour_state"] = slurm_cluster.job_field(neighbour, "JobState")
    seen["neighbour_alive"] = [_alive(p) for p in seen["neighbour_pids"]]
    seen["stops"] = [events(run, r, "stop")[-1] for r in (0, 1)]
    slurm_cluster.run("scancel", neighbour, check=False)

    resume = Console("resume", run, "--json", "--env", "TAEHV_FAULTS=", env=env, cwd=work)
    seen["resume_rc"] = resume.wait(500)
    seen["resume"] = resume
    seen["state_at_end"] = run_state(run)
    return seen


def test_sbatch_stop_ends_only_this_jobs_steps_with_a_verified_checkpoint(sbatch_story):
    from trainer import checkpoint as ckpt

    s = sbatch_story
    assert s["job_nodes"] == "n[1-2]"
    assert s["stop_rc"] == ExitCode.STOPPED, s["stop_result"]
    stops = s["stops"]
    assert all(e["reason"] == "signal" and e["exit_status"] == 0 for e in stops)
    step = stops[0]["step"]
    assert stops[1]["step"] == step
    state = s["state_after_stop"]
    assert (
        state["phase"] == "stopped" and state["stop"]["checkpoint_step"] == step and state["stop"]["verified"]
    )
    status = ckpt.verify(s["run"] / "checkpoints" / f"step-{step}")
    assert status.ok and status.step == step, status.problems
    # this job is over and its ranks are gone; the other job on the same nodes still runs
    assert s["job_state_after_stop"] not in ("RUNNING", "PENDING", "COMPLETING") and s["ranks_left"] == []
    assert s["neighbour_state"] == "RUNNING" and s["neighbour_alive"] == [True, True]


def test_sbatch_resume_runs_to_final_weights_on_both_nodes(sbatch_story):
    s = sbatch_story
    _finished_with_weights(s["resume_rc"], s["resume"], s["run"])
    state = s["state_at_end"]
    assert state["backend"] == "sbatch" and state["attempts"][-1]["resume"] == "latest"
    stopped_at = s["stops"][0]["step"]
    assert events(s["run"], 0, "start")[-1]["resumed_from"].endswith(f"step-{stopped_at}")


def test_sbatch_preflight_ran_on_each_node_and_left_its_report(sbatch_story):
    run = sbatch_story["run"]
    for node in (0, 1):
        report = json.loads((run / "preflight" / f"node-{node}.json").read_text())
        assert report["ok"] and report["topology"]["source"] == "slurm"
        assert report["topology"]["this_node_rank"] == node and report["topology"]["node_count"] == 2


def test_sbatch_preflight_error_stops_the_job_before_training(slurm_cluster, tmp_path):
    missing = tmp_path / "no-such-data"
    console = Console(
        *_args(tmp_path, 3, "--backend", "sbatch", "--data", str(missing)),
        env=slurm_cluster.client_env(),
        cwd=tmp_path,
    )
    run = _run_dir(console, tmp_path)
    rc = console.wait(240)
    result = console.result()
    assert rc == ExitCode.TRAINING_FAILED, console.tail()
    assert not (run / "events").exists() or not list((run / "events").iterdir())  # no rank started
    failure = result["failure"]
    text = "\n".join([failure["reason"], *failure["log_lines"]])
    # the findings as the node printed them, one line each
    assert any(
        "data-missing" in line and f"{missing} does not exist" in line for line in failure["log_lines"]
    ), text
    for node in (0, 1):
        report = json.loads((run / "preflight" / f"node-{node}.json").read_text())
        assert not report["ok"] and any(f["id"] == "data-missing" for f in report["findings"])
    job = run_state(run)["attempts"][-1]["slurm_job"]
    assert slurm_cluster.job_field(job, "ExitCode") == "3:0"


def test_sbatch_launches_under_a_runs_path_with_a_space_and_non_ascii_letters(slurm_cluster, tmp_path):
    """Issue 44: `#SBATCH --output=` under `my runs/ünï cödé` was unquoted; sbatch refused the
    script ('Invalid directive found in batch script') and the run was reported training_failed.
    One short run (one step) through preflight and training to its final weights."""
    work = tmp_path / "my runs" / "ünï cödé"
    work.mkdir(parents=True)
    console = Console(*_args(work, 1, "--backend", "sbatch"), env=slurm_cluster.client_env(), cwd=work)
    run = _run_dir(console, work)
    rc = console.wait(420)
    _finished_with_weights(rc, console, run)
    job = run_state(run)["attempts"][-1]["slurm_job"]
    assert (run / "logs" / f"slurm-{job}.out").is_file()  # where the quoted directive said


# ------------------------------------------------------------------------------- in an allocation


def test_a_console_inside_an_allocation_launches_both_nodes_to_final_weights(slurm_cluster, tmp_path):
    # salloc runs the console on this machine with the allocation's SLURM_* variables: it detects
    # the SLURM topology and starts every node with srun (the `slurm` backend)
    argv = ["salloc", "--nodes=2", "--job-name=in-allocation", *cli_argv(*_args(tmp_path, 2))]
    console = Console(argv=argv, env=slurm_cluster.client_env(), cwd=tmp_path)
    run = _run_dir(console, tmp_path)
    rc = console.wait(420)
    state = run_state(run)
    assert state["backend"] == "slurm" and list(state["hosts"]) == ["n1", "n2"]
    _finished_with_weights(rc, console, run)


def _kill_rank_1_in_an_allocation(
    slurm_cluster, tmp_path, job_name: str, max_steps: int, *extra: str, hold_port: bool = False
) -> tuple[Console, Path, int]:
    """A console in a two-node allocation (checkpoints every 5 steps, 1 s backoff); rank 1 (on n2;
    the "nodes" are loopback, so its pid is this machine's) killed with SIGKILL at step 7, after
    the first checkpoint: (the console, the run, its exit code). `hold_port`: another process
    takes the run's rendezvous port the moment the killed attempt lets it go, and keeps it."""
    extra = ("--set", "schedule.checkpoint_every=5", "--set", "recovery.backoff_s=1", *extra)
    argv = ["salloc", "--nodes=2", f"--job-name={job_name}", *cli_argv(*_args(tmp_path, max_steps, *extra))]
    console = Console(argv=argv, env=slurm_cluster.client_env(), cwd=tmp_path)
    run = _run_dir(console, tmp_path)
    console.wait_for(lambda o: is_step(o, 7), 420, "step 7, after the checkpoint at step 5")
    victim = json.loads((run / "heartbeat" / "rank-1.json").read_text())["pid"]
    holder = PortHolder(run_state(run)["master_port"]) if hold_port else None
    os.kill(victim, signal.SIGKILL)
    try:
        return console, run, console.wait(600)
    finally:
        if holder is not None:
            assert holder.taken.is_set(), "the port was never free to take"
            holder.close()


def test_a_rendezvous_port_taken_before_the_relaunch_moves_the_run_to_the_next_port(slurm_cluster, tmp_path):
    """What failed a CI run once: between a killed attempt and its relaunch another process took
    the run's rendezvous port, node 0's launcher refused to start, and the run ended there ("the
    cause is not known well enough"). Now the taken port is the cause, retried on the next port:
    every launch file says the new one, and the run reaches final weights."""
    console, run, rc = _kill_rank_1_in_an_allocation(
        slurm_cluster, tmp_path, "port-taken", 14, hold_port=True
    )
    _finished_with_weights(rc, console, run)
    state = run_state(run)
    killed, refused, done = state["attempts"]
    assert (killed["cause"], killed["decision"]) == ("signal", "restart"), killed
    assert (refused["cause"], refused["decision"], refused["blamed_node"]) == ("port-in-use", "restart", None)
    assert f"port {state['master_port'] - 1} is taken" in refused["why"], refused
    assert done["outcome"] == "done" and done["restarted_by"] == "recovery", done
    for node in (0, 1):
        config = (run / f"accelerate-node-{node}.yaml").read_text()
        assert f"main_process_port: {state['master_port']}" in config, config
    notes = [o.get("message", "") for o in console.lines if o.get("kind") == "note"]
    moved = f"the relaunch uses port {state['master_port']}"
    assert any(moved in n for n in notes), notes


def test_a_rank_killed_inside_an_allocation_is_relaunched_with_srun_and_reaches_final_weights(
    slurm_cluster, tmp_path
):
    """Issue 20's SLURM story: in an allocation the console is its own supervisor. Rank 1 (on n2;
    the "nodes" are loopback, so its pid is this machine's) is killed with SIGKILL after the first
    checkpoint; the console relaunches the srun step in the same allocation from that checkpoint,
    and the run reaches final weights with the time lost recorded."""
    t0 = time.time()
    console, run, rc = _kill_rank_1_in_an_allocation(slurm_cluster, tmp_path, "in-allocation-recovery", 14)
    state = run_state(run)
    assert state["backend"] == "slurm" and list(state["hosts"]) == ["n1", "n2"]
    _finished_with_weights(rc, console, run)
    first, second = state["attempts"]
    assert (first["cause"], first["decision"], first["outcome"]) == ("signal", "restart", "failed"), first
    assert second["restarted_by"] == "recovery" and second["resume"] == "latest", second
    assert second["from_step"] in (5, 10) and second["outcome"] == "done", second
    assert second["redone_steps"] == first["reached_step"] - second["from_step"] >= 0, (first, second)
    assert 0 < second["lost_s"] < 300, second
    # each attempt is its own srun step, started by the console in the same allocation
    drivers = [a["nodes"] for a in state["attempts"]]
    assert (
        all(len(d) == 1 and d[0]["index"] == -1 for d in drivers)
        and drivers[0][0]["pid"] != drivers[1][0]["pid"]
    )
    print(
        f"\nSLURM, kill -9 of rank 1 -> training again: {second['lost_s']} s, "
        f"{second['redone_steps']} step(s) redone; whole test {time.time() - t0:.0f} s"
    )


class _Steps:
    """The job's srun steps as `squeue --steps` shows them (step id -> node list), polled on a
    thread for as long as the test runs: each step is seen while it lives, however short."""

    def __init__(self, slurm_cluster, job_name: str):
        self.cluster, self.name = slurm_cluster, job_name
        self.seen: dict[str, str] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._done.wait(0.5):
            job = self.cluster.run("squeue", "-h", "-n", self.name, "-o", "%i", check=False).stdout.strip()
            if not job:
                continue
            res = self.cluster.run("squeue", "-h", "--steps", "-j", job, "-o", "%i %N", check=False)
            for line in res.stdout.splitlines():
                step, _, nodes = line.strip().partition(" ")
                if step and nodes:
                    self.seen[step] = nodes.strip()

    def stop(self) -> dict[str, str]:
        self._done.set()
        self._thread.join(10)
        return {k: self.seen[k] for k in sorted(self.seen, key=lambda s: int(s.rpartition(".")[2]))}


def test_a_node_whose_rank_is_killed_inside_an_allocation_is_left_out_and_the_run_ends_on_one_node(
    slurm_cluster, tmp_path
):
    """Issue 20's exclusion on SLURM: inside a two-node allocation, rank 1 (on n2, machine rank 1)
    is killed with SIGKILL after the first checkpoint. The console leaves n2 out, converts the
    newest checkpoint to a universal one, renders the one-node files, and starts the next srun step
    on n1 alone, where the run goes on at world size 1 to final weights.

    recovery.exclude_after=1: a rank killed by a signal is one strike against its node, neither
    hardware evidence nor an unreachable node, so with the default (2) the console would first
    restart on both nodes and leave n2 out only at its second failure. One strike stands in for a
    node that keeps failing, so that one kill reaches the exclusion."""
    name = "in-allocation-exclude"
    t0 = time.time()
    steps = _Steps(slurm_cluster, name)
    try:
        console, run, rc = _kill_rank_1_in_an_allocation(
            slurm_cluster, tmp_path, name, 16, "--set", "recovery.exclude_after=1"
        )
    finally:
        srun_steps = steps.stop()
    assert rc == ExitCode.DONE, console.tail()
    state = run_state(run)
    first, second = state["attempts"]
    assert (first["cause"], first["decision"], first["blamed_node"]) == ("signal", "exclude", 1), first
    assert "1 strikes, exclude_after = 1" in first["why"], first["why"]
    assert second["restarted_by"] == "recovery" and second["outcome"] == "done", second
    assert second["from_step"] in (5, 10), second
    (left_out,) = state["exclusions"]
    assert (left_out["node"], left_out["host"], left_out["replaced_by"]) == (1, "n2", None), left_out
    assert (left_out["nodes_before"], left_out["nodes_after"]) == (2, 1)
    assert Path(left_out["checkpoint"]).name == f"step-{second['from_step']}", left_out
    assert list(state["hosts"]) == ["n1"] and state["master_addr"] == "n1" and state["controlled"] == [0], (
        state
    )
    assert state["spares"] == []
    # run.toml and the launch files are the one-node run's, n1 the rendezvous
    assert load_config(run / "run.toml").topology.nodes == 1
    hostfile = (run / "hostfile").read_text().splitlines()
    assert [line for line in hostfile if not line.startswith("#")] == ["n1 slots=1"], hostfile
    assert "main_process_ip: n1" in (run / "accelerate-node-0.yaml").read_text()
    assert not (run / "accelerate-node-1.yaml").exists()
    # the first step ran on both nodes, the second on n1 alone: SLURM's own record of each step
    assert list(srun_steps.values()) == ["n[1-2]", "n1"], srun_steps
    # ... and on it, machine rank 0 only: no wrapper of the second attempt on a node 1
    st = json.loads((run / "logs" / "node-0.status.json").read_text())
    assert st["node"] == 0 and st["attempt"] == 2 and st["exit_code"] == 0, st
    assert not (run / "logs" / "node-1.status.json").exists()
    assert "attempt 2" not in (run / "logs" / "node-1.log").read_text()
    # the universal checkpoint was loaded at world size 1; the run ends there
    log = (run / "logs" / "node-0.log").read_text()
    assert "loaded the universal checkpoint" in log and "(written by 2 processes) at 1" in log, log[-3000:]
    start = [e for e in events(run, 0, "start") if e.get("world_size") == 1]
    assert start and start[-1]["step"] == second["from_step"], start
    final = ckpt.scan(run / "checkpoints").newest
    assert final is not None and final.step == 16 and final.world_size == 1
    assert (run / "final" / "taehv.safetensors").is_file()
    notes = [o.get("message", "") for o in console.lines if o.get("kind") == "note"]
    assert any("node 1 (n2) left out: the run goes on with 1 node(s)" in n for n in notes), notes
    print(
        f"\nSLURM, kill -9 of rank 1, n2 left out -> training again on n1: {second['lost_s']} s, "
        f"{second['redone_steps']} step(s) redone; steps {srun_steps}; whole test {time.time() - t0:.0f} s"
    )


def test_a_run_resumed_in_another_allocation_runs_on_that_allocations_node(slurm_cluster, tmp_path):
    """A one-node run started in an allocation on n1 and stopped there; `resume` in a new
    allocation that holds n2 alone: the run's recorded host (n1) is not in it, so n2 takes its
    machine rank, the launch files are written for n2, and training goes on from the stop's
    checkpoint to final weights. Before, the srun step asked for n1 and SLURM refused it."""
    env = slurm_cluster.client_env()
    # the stop must land mid-run: 14 steps after step 2, at ~0.5 s a step on a loaded 2-core machine
    args = _args(tmp_path, 16, "--set", "topology.nodes=1")
    first = Console(
        argv=["salloc", "--nodes=1", "--nodelist=n1", "--job-name=alloc-1", *cli_argv(*args)],
        env=env,
        cwd=tmp_path,
    )
    run = _run_dir(first, tmp_path)
    first.wait_for(lambda o: is_step(o, 2), 420, "step 2")
    stopped = run_cli("stop", run, "--json", env=env, cwd=tmp_path, timeout=300)
    assert stopped.returncode == ExitCode.DONE, stopped.stdout + stopped.stderr
    assert first.wait(120) == ExitCode.STOPPED, first.tail()
    state = run_state(run)
    stopped_at = state["stop"]["checkpoint_step"]
    assert list(state["hosts"]) == ["n1"] and stopped_at is not None

    resume = Console(
        argv=[
            "salloc",
            "--nodes=1",
            "--nodelist=n2",
            "--job-name=alloc-2",
            *cli_argv("resume", run, "--json"),
        ],
        env=env,
        cwd=tmp_path,
    )
    rc = resume.wait(420)
    assert rc == ExitCode.DONE, resume.tail() + resume.stderr[-2000:]
    state = run_state(run)
    assert list(state["hosts"]) == ["n2"] and state["master_addr"] == "n2"
    assert "main_process_ip: n2" in (run / "accelerate-node-0.yaml").read_text()
    notes = [o.get("message", "") for o in resume.lines if o.get("kind") == "note"]
    assert any(
        "the run's nodes (n1) are not in this allocation" in n and "it runs on n2" in n for n in notes
    ), notes
    assert events(run, 0, "start")[-1]["resumed_from"].endswith(f"step-{stopped_at}")
    assert (run / "final" / "taehv.safetensors").is_file()
