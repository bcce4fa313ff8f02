"""The SLURM backends' commands, run against stand-in sbatch/squeue/scancel/sacct/srun scripts
(no SLURM here): what is submitted, how the job's state and exit are read, and that a stop is
scancel --signal=TERM first."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from taehv_console.core.run.backends import NodeCommand, SbatchBackend, SrunBackend
from taehv_console.core.run.rundir import create_run_dir
from taehv_console.core.run.state import Attempt


def _tool(bin_dir: Path, name: str, body: str) -> str:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" f'echo "{name} $*" >> "{bin_dir}/calls"\n' + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


@pytest.fixture
def slurm(tmp_path):
    b = tmp_path / "bin"
    b.mkdir()
    state = tmp_path / "job-state"
    state.write_text("RUNNING")
    tools = {
        "sbatch": _tool(b, "sbatch", 'echo "4242;cluster"\n'),
        "squeue": _tool(b, "squeue", f'cat "{state}"\n'),
        "scancel": _tool(b, "scancel", ""),
        "sacct": _tool(b, "sacct", f'cat "{tmp_path}/sacct"\n'),
    }
    return tools, b / "calls", state, tmp_path / "sacct"


def _cmd(run, resume=False):
    argv = ["accelerate", "launch", "--config_file", f"{run.path}/accelerate-node-0.yaml", "-m", "trainer.cli",
            "--run", str(run.path)] + (["--resume", "latest"] if resume else [])
    return NodeCommand(0, "n0", tuple(argv), {"DS_ACCELERATOR": "cpu"}, str(run.node_log(0)),
                       str(run.node_status_path(0)), str(run.path))


def test_sbatch_submits_the_rendered_script_and_follows_the_job(tmp_path, slurm):
    tools, calls, job_state, sacct = slurm
    run = create_run_dir(tmp_path / "runs", "16gpu-h100")
    (run.path / "sbatch.sh").write_text("#!/bin/bash\n")
    b = SbatchBackend(**tools)
    started = b.start(run, [_cmd(run)], 1)
    assert started.slurm_job == "4242" and not started.errors
    assert f"sbatch --parsable --chdir={run.path} {run.path}/sbatch.sh" in calls.read_text()
    a = Attempt(1, 0.0, slurm_job="4242")
    assert b.processes(run, a) == {-1: (4242,)}
    assert b.terminate(run, a) == {}
    assert "scancel --signal=TERM 4242" in calls.read_text()
    job_state.write_text("")
    assert b.processes(run, a) == {-1: ()}
    for line, code in (("FAILED|1:0", 1), ("CANCELLED by 0|0:15", -15), ("COMPLETED|0:0", 0), ("RUNNING|0:0", None)):
        sacct.write_text(line + "\n")
        assert b.job_exit_code(a) == code, line


def test_sbatch_refuses_a_resume_it_cannot_express(tmp_path, slurm):
    run = create_run_dir(tmp_path / "runs", "16gpu-h100")
    (run.path / "sbatch.sh").write_text("#!/bin/bash\n")
    started = SbatchBackend(**slurm[0]).start(run, [_cmd(run, resume=True)], 2)
    assert started.slurm_job is None and "resume from inside an allocation" in started.errors[-1]


def test_srun_starts_the_wrapper_on_every_node_with_its_own_machine_rank(tmp_path):
    from taehv_console.core.cluster.ssh import SshPool, SshSettings

    run = create_run_dir(tmp_path / "runs", "16gpu-h100")
    with SshPool(SshSettings.from_env()) as pool:
        argv = SrunBackend(pool, nodes=2).srun_argv(run, [_cmd(run)], 3)
    assert argv[:5] == ["srun", "--kill-on-bad-exit=1", "--nodes=2", "--ntasks-per-node=1",
                        f"--output={run.logs}/node-%n.log"]
    rest = argv[argv.index("taehv_console.core.run.node"):]
    assert rest[rest.index("--node-env") + 1] == "SLURM_NODEID" and rest[rest.index("--attempt") + 1] == "3"
    assert f"{run.path}/accelerate-node-{{node}}.yaml" in argv  # filled per node from SLURM_NODEID
    assert str(run.logs / "node-{node}.status.json") in argv
    # the wrapper fills {node} from the variable: node 1 reads its own config and status (in a
    # process of its own: the wrapper makes itself a subreaper and ignores SIGTERM)
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "taehv_console.core.run.node", "launch", "--status",
                           str(tmp_path / "n-{node}.json"), "--node-env", "SLURM_NODEID", "--", "sh", "-c",
                           "echo {node} > " + str(tmp_path / "which")],
                          env={**os.environ, "SLURM_NODEID": "1"}, capture_output=True, timeout=30, check=False)
    assert proc.returncode == 0 and (tmp_path / "which").read_text().strip() == "1"
    assert (tmp_path / "n-1.json").exists()
