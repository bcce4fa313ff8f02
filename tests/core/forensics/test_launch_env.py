"""Flight Recorder's environment reaches every NCCL rank: rendered into the sbatch script and the
Kubernetes job, and added by the launch backends to what each node's launcher really gets (a real
detached launch through the node wrapper that writes out its environment). Gloo runs get none."""

from __future__ import annotations

import ast
import sys
import time
from pathlib import Path

from taehv_console.core.cluster.ssh import SshPool, SshSettings
from taehv_console.core.plan.flight_recorder import flight_recorder_env
from taehv_console.core.plan.presets import load_preset
from taehv_console.core.plan.render import RenderOptions, k8s_manifests, launch_env, render_sbatch
from taehv_console.core.run.backends import NodeCommand, RunnerBackend, flight_recorder_env_for
from taehv_console.core.run.rundir import RunDir
from tests.core.forensics.conftest import make_run

FR_VARS = (
    "TORCH_NCCL_TRACE_BUFFER_SIZE",
    "TORCH_NCCL_DUMP_ON_TIMEOUT",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
)


def _cfg(device: str, **nccl):
    cfg = load_preset("16gpu-h100" if device == "cuda" else "cpu-smoke").config
    if nccl:
        cfg = cfg.model_copy(update={"distributed": cfg.distributed.model_copy(update={"nccl_env": nccl})})
    return cfg


def test_launch_env_with_a_run_dir_adds_flight_recorder_for_nccl_only():
    env = launch_env(_cfg("cuda"), "/shared/runs/r1")
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/shared/runs/r1/forensics/fr/live/trace_rank_"
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/tmp/taehv-fr-r1-rank_"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert not any(k in launch_env(_cfg("cpu"), "/shared/runs/r1") for k in FR_VARS)
    assert not any(k in launch_env(_cfg("cuda")) for k in FR_VARS[2:])  # no run dir: nothing to point at


def test_the_configs_own_nccl_env_wins():
    env = launch_env(_cfg("cuda", TORCH_NCCL_TRACE_BUFFER_SIZE="500"), "/r")
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "500"


def test_sbatch_and_k8s_carry_it():
    cfg = _cfg("cuda")
    script = render_sbatch(cfg, RenderOptions(run_dir="/shared/runs/r1", hosts=()))
    assert "export TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/tmp/taehv-fr-r1-rank_" in script
    assert "/shared/runs/r1/forensics/fr/live" in script.split("mkdir -p", 1)[1].splitlines()[0]
    job = k8s_manifests(cfg, RenderOptions(run_dir="/shared/runs/r1"))[-1]
    names = {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert set(FR_VARS) <= names
    cpu = render_sbatch(_cfg("cpu"), RenderOptions(run_dir="/shared/runs/r1"))
    assert "TORCH_NCCL_DEBUG_INFO" not in cpu and "forensics" not in cpu


def test_backend_env_for_a_run(tmp_path):
    cuda = RunDir(make_run(tmp_path, device="cuda"))
    env = flight_recorder_env_for(cuda)
    assert env == flight_recorder_env(cuda.path)
    assert (cuda.path / "forensics" / "fr" / "live").is_dir()  # made before any rank starts
    assert flight_recorder_env_for(RunDir(make_run(tmp_path, device="cpu"))) == {}
    assert flight_recorder_env_for(RunDir(tmp_path / "no-such-run")) == {}


def test_a_launched_node_gets_the_variables(tmp_path):
    run = RunDir(make_run(tmp_path, device="cuda"))
    out = tmp_path / "env.txt"
    command = NodeCommand(
        index=0,
        host="localhost",
        argv=(sys.executable, "-c", f"import os; open({str(out)!r}, 'w').write(repr(dict(os.environ)))"),
        env={"TORCH_NCCL_TRACE_BUFFER_SIZE": "1234"},
        log=str(run.node_log(0)),
        status=str(run.node_status_path(0)),
        cwd=str(run.path),
    )
    run.logs.mkdir(exist_ok=True)
    with SshPool(SshSettings.from_env()) as pool:
        started = RunnerBackend("local", pool).start(run, [command], attempt=1)
    assert started.errors == {}
    deadline = time.monotonic() + 60
    while not out.exists() or not out.read_text().endswith("}"):
        assert time.monotonic() < deadline, "the launched process never wrote its environment"
        time.sleep(0.05)
    env = ast.literal_eval(out.read_text())
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(
        run.path / "forensics" / "fr" / "live" / "trace_rank_"
    )
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == f"/tmp/taehv-fr-{run.path.name}-rank_"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "1234"  # the command's own value wins
    assert Path(env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]).parent.is_dir()
