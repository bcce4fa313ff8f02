"""The SLURM backends against the real loopback cluster: what sbatch submits and how the job's state
and exit are read back (scontrol; this cluster has no accounting), the stop as `scancel
--signal=TERM` reaching the job's steps, a resume passed on to the script, and the srun line of
the in-allocation backend filling each node's machine rank from SLURM_NODEID."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from taehv_console.core.plan.render import LAUNCHER
from taehv_console.core.run.backends import NodeCommand, SbatchBackend, SrunBackend
from taehv_console.core.run.rundir import create_run_dir
from taehv_console.core.run.state import Attempt


def _cmd(run, resume: str | None = None) -> NodeCommand:
    argv = [
        *LAUNCHER,
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


def _probe_commands(run, tmp_path, hosts: list[str]) -> list[NodeCommand]:
    """One command per node, as the controller makes them: each names its host and its own config
    file, here a probe that writes the SLURM node it ran on and the step's node count into it."""
    return [
        NodeCommand(
            i,
            host,
            (
                "sh",
                "-c",
                f"echo $SLURMD_NODENAME $SLURM_STEP_NUM_NODES > {tmp_path}/accelerate-node-{i}.yaml",
            ),
            {},
            str(run.node_log(i)),
            str(run.node_status_path(i)),
            str(run.path),
        )
        for i, host in enumerate(hosts)
    ]


def _srun_in_allocation(slurm_cluster, argv: list[str]) -> None:
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


def test_srun_starts_the_wrapper_on_every_node_with_its_own_machine_rank(slurm_cluster, tmp_path):
    from taehv_console.core.cluster.ssh import SshPool, SshSettings

    run = create_run_dir(tmp_path / "runs", "cpu-smoke")
    run.logs.mkdir(parents=True, exist_ok=True)
    with SshPool(SshSettings.from_env()) as pool:
        argv = SrunBackend(pool).srun_argv(run, _probe_commands(run, tmp_path, ["n1", "n2"]), 3)
    assert "--nodes=2" in argv and "--nodelist=n1,n2" in argv
    _srun_in_allocation(slurm_cluster, argv)
    # `accelerate-node-0.yaml` in the command became each node's own: node 1 wrote node-1's file
    assert [(tmp_path / f"accelerate-node-{n}.yaml").read_text().split() for n in (0, 1)] == [
        ["n1", "2"],
        ["n2", "2"],
    ]
    for n in (0, 1):
        st = json.loads(run.node_status_path(n).read_text())
        assert st["node"] == n and st["attempt"] == 3 and st["exit_code"] == 0
        assert f"node {n} attempt 3 on" in run.node_log(n).read_text()


def test_after_node_0_is_left_out_the_step_runs_on_the_other_node_alone_as_machine_rank_0(
    slurm_cluster, tmp_path
):
    """Issue 20: the console left n1 (machine rank 0) out; the run's one node is now n2. The next
    step must run on n2 only, and n2 must be machine rank 0 (SLURM_NODEID, and %n in the log's
    name), as the launch files rendered for the remaining hosts say. A step left to `--nodes=1`
    alone would run on n1, the allocation's first node."""
    from taehv_console.core.cluster.ssh import SshPool, SshSettings

    run = create_run_dir(tmp_path / "runs", "cpu-smoke")
    run.logs.mkdir(parents=True, exist_ok=True)
    with SshPool(SshSettings.from_env()) as pool:
        argv = SrunBackend(pool, nodes=2).srun_argv(run, _probe_commands(run, tmp_path, ["n2"]), 2)
    _srun_in_allocation(slurm_cluster, argv)
    assert (tmp_path / "accelerate-node-0.yaml").read_text().split() == ["n2", "1"]
    assert not (tmp_path / "accelerate-node-1.yaml").exists() and not run.node_status_path(1).exists()
    st = json.loads(run.node_status_path(0).read_text())
    assert st["node"] == 0 and st["attempt"] == 2 and st["exit_code"] == 0
    assert "node 0 attempt 2 on" in run.node_log(0).read_text() and not run.node_log(1).exists()


def test_srun_refuses_machine_ranks_slurm_would_number_otherwise(tmp_path):
    from taehv_console.core.cluster.ssh import SshPool, SshSettings

    run = create_run_dir(tmp_path / "runs", "cpu-smoke")
    run.logs.mkdir(parents=True, exist_ok=True)
    (only_node_1,) = _probe_commands(run, tmp_path, ["n1", "n2"])[1:]
    with SshPool(SshSettings.from_env()) as pool:
        started = SrunBackend(pool).start(run, [only_node_1], 1)
    assert started.launchers == () and "not [1]" in started.errors[-1]


def test_a_node_is_down_when_slurm_says_so_not_when_ssh_does_not_answer(slurm_cluster, tmp_path, monkeypatch):
    """The console inside an allocation asks SLURM whether a node is there, not ssh: many clusters
    let no one ssh to a compute node, and a node is up while its slurmd answers."""
    from taehv_console.core.cluster.ssh import SshPool, SshSettings

    for k, v in slurm_cluster.env().items():
        monkeypatch.setenv(k, v)
    with SshPool(SshSettings.from_env()) as pool:
        srun = SrunBackend(pool)
        assert srun.node_down("n2") == "" and srun.node_down("n1") == ""
        assert srun.node_down("no-such-node") == ""  # scontrol cannot tell: no evidence
        try:
            slurm_cluster.run("scontrol", "update", "nodename=n2", "state=down", "reason=taehv-test")
            assert srun.node_down("n2") == "DOWN" and srun.node_down("n1") == ""
        finally:
            slurm_cluster.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
            _wait(slurm_cluster._all_idle, 60, "n2 idle again")


ODD = "my runs/ünï cödé 5%new"  # a space, non-ASCII letters and SLURM's pattern character (issue 44)


def test_the_rendered_output_directive_is_read_by_sbatch_under_a_path_with_a_space_and_non_ascii(
    slurm_cluster, backend, tmp_path
):
    """The real sbatch parses the rendered #SBATCH lines (before: 'Invalid directive found in batch
    script' for the unquoted --output); the body is replaced by an echo, so nothing trains."""
    from taehv_console.core.plan.presets import load_preset
    from taehv_console.core.plan.render import RenderOptions, render_sbatch

    run = create_run_dir(tmp_path / ODD, "cpu-smoke")
    cfg = load_preset("cpu-smoke", user_dir=None, overrides=["topology.nodes=2"]).config
    header = [
        ln
        for ln in render_sbatch(cfg, RenderOptions(run_dir=str(run.path))).splitlines()
        if ln.startswith("#")
    ]
    (run.path / "sbatch.sh").write_text("\n".join([*header, 'echo "hello from $SLURM_JOB_ID"', ""]))
    started = backend.start(run, [_cmd(run)], 1)
    assert not started.errors and started.slurm_job, started.errors
    a = Attempt(1, 0.0, slurm_job=started.slurm_job)
    _wait(lambda: backend.processes(run, a) == {-1: ()}, 60, "the job's end")
    assert backend.job_exit_code(a) == 0
    out = run.logs / f"slurm-{started.slurm_job}.out"
    assert f"hello from {started.slurm_job}" in out.read_text()


def test_srun_writes_each_nodes_log_under_a_path_with_a_space_non_ascii_and_percent(slurm_cluster, tmp_path):
    from taehv_console.core.cluster.ssh import SshPool, SshSettings

    run = create_run_dir(tmp_path / ODD, "cpu-smoke")
    with SshPool(SshSettings.from_env()) as pool:
        argv = SrunBackend(pool).srun_argv(run, _probe_commands(run, tmp_path, ["n1", "n2"]), 1)
    _srun_in_allocation(slurm_cluster, argv)
    for n in (0, 1):
        assert f"node {n} attempt 1 on" in run.node_log(n).read_text()
