"""The SLURM backends against the real loopback cluster: what sbatch submits and how the job's state
and exit are read back (scontrol; this cluster has no accounting), the stop as `scancel
--signal=TERM` reaching the job's steps, a resume passed on to the script, and the srun line of
the in-allocation backend filling each node's machine rank from SLURM_NODEID."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from taehv_console.core.run.backends import NodeCommand, SbatchBackend, SrunBackend
from taehv_console.core.run.rundir import create_run_dir
from taehv_console.core.run.state import Attempt


def _cmd(run, resume: str | None = None) -> NodeCommand:
    argv = [
        "accelerate",
        "launch",
        "--config_file",
        f"{run.path}/accelerate-node-0.yaml",
        "-m",
        "trainer.cli",
        "--run",
        str(run.path),
    ] + (["--resume", resume] if resume else [])
    return NodeCommand(
        0,
        "n1",
        tuple(argv),
        {"DS_ACCELERATOR": "cpu"},
        str(run.node_log(0)),
        str(run.node_status_path(0)),
        str(run.path),
    )


def _wait(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.2)


@pytest.fixture
def backend(slurm_cluster, monkeypatch):
    for k, v in slurm_cluster.env().items():
        monkeypatch.setenv(k, v)
    return SbatchBackend()


def test_sbatch_submits_the_script_and_a_term_stop_reaches_the_jobs_steps(slurm_cluster, backend, tmp_path):
    run = create_run_dir(tmp_path / "runs", "cpu-smoke")
    # a step that records its environment, then answers SIGTERM with exit 7 (the batch shell
    # itself is not signalled by scancel --signal: it sees its step fail and exits 9)
    (run.path / "sbatch.sh").write_text(
        "#!/bin/bash\n#SBATCH --nodes=2\n"
        f'srun --nodes=2 --ntasks-per-node=1 bash -c \'echo "$TAEHV_ATTEMPT $TAEHV_RESUME" > {tmp_path}/env-$SLURM_NODEID;'
        ' trap "exit 7" TERM; sleep 300 & wait\' || exit 9\n'
    )
    started = backend.start(run, [_cmd(run, resume="latest")], 3)
    assert not started.errors and started.slurm_job
    job = started.slurm_job
    a = Attempt(3, 0.0, slurm_job=job)
    _wait(lambda: all((tmp_path / f"env-{n}").exists() for n in (0, 1)), 60, "both steps' tasks")
    assert [(tmp_path / f"env-{n}").read_text().split() for n in (0, 1)] == [["3", "latest"]] * 2
    assert backend.processes(run, a) == {-1: (int(job),)} and backend.job_exit_code(a) is None
    assert backend.terminate(run, a) == {}
    _wait(lambda: backend.processes(run, a) == {-1: ()}, 60, "the job's end")
    assert backend.job_exit_code(a) == 9
    assert slurm_cluster.job_field(job, "WorkDir") == str(run.path)


def test_a_cancelled_job_reads_as_killed(slurm_cluster, backend, tmp_path):
    run = create_run_dir(tmp_path / "runs", "cpu-smoke")
    (run.path / "sbatch.sh").write_text("#!/bin/bash\nsleep 300\n")
    job = backend.start(run, [_cmd(run)], 1).slurm_job
    a = Attempt(1, 0.0, slurm_job=job)
    slurm_cluster.wait_job_state(job, {"RUNNING"}, 60)
    backend.kill(run, a)
    _wait(lambda: backend.processes(run, a) == {-1: ()}, 60, "the job's end")
    assert slurm_cluster.job_field(job, "JobState") == "CANCELLED"
    assert backend.job_exit_code(a) in (-9, -15)  # killed by a signal, not an exit status


def test_sbatch_reports_a_rejected_submission(slurm_cluster, backend, tmp_path):
    run = create_run_dir(tmp_path / "runs", "cpu-smoke")
    (run.path / "sbatch.sh").write_text(
        "#!/bin/bash\n#SBATCH --partition=gpu-h100\ntrue\n"
    )  # there is only `debug`
    started = backend.start(run, [_cmd(run)], 1)
    assert started.slurm_job is None
    assert "sbatch failed" in started.errors[-1] and "invalid partition" in started.errors[-1].lower()


def test_srun_starts_the_wrapper_on_every_node_with_its_own_machine_rank(slurm_cluster, tmp_path):
    from taehv_console.core.cluster.ssh import SshPool, SshSettings

    run = create_run_dir(tmp_path / "runs", "cpu-smoke")
    run.logs.mkdir(parents=True, exist_ok=True)
    probe = ("sh", "-c", f"echo $SLURMD_NODENAME > {tmp_path}/accelerate-node-0.yaml")
    cmd = NodeCommand(0, "n1", probe, {}, str(run.node_log(0)), str(run.node_status_path(0)), str(run.path))
    with SshPool(SshSettings.from_env()) as pool:
        argv = SrunBackend(pool, nodes=2).srun_argv(run, [cmd], 3)
    # what the console runs inside an allocation, here inside a real one
    res = subprocess.run(
        ["salloc", "--nodes=2", *argv],
        env=slurm_cluster.client_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    # `accelerate-node-0.yaml` in the command became each node's own: node 1 wrote node-1's file
    assert [(tmp_path / f"accelerate-node-{n}.yaml").read_text().strip() for n in (0, 1)] == ["n1", "n2"]
    for n in (0, 1):
        st = json.loads(run.node_status_path(n).read_text())
        assert st["node"] == n and st["attempt"] == 3 and st["exit_code"] == 0
        assert f"node {n} attempt 3 on" in run.node_log(n).read_text()
