"""Fixtures for forensics tests: real Python processes stuck in a known function (the stand-in for
a rank: py-spy reads a real interpreter), and run directories with run.toml and state.json."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taehv_console.core.plan.presets import load_preset
from taehv_console.core.run.state import Phase, RunState, write_state
from tests.core.forensics.record_fixtures import STUCK
from trainer.config import config_to_toml

FIXTURES = Path(__file__).with_name("fixtures")
REPO = Path(__file__).parents[3]


@pytest.fixture
def stuck_process():
    """stuck_process(*prefix, script=STUCK, args=()) -> Popen of a Python process stuck in
    wait_for_batch (run from the repository, which it may import); killed at the end."""
    started: list[subprocess.Popen] = []

    def start(*prefix: str, script: str = STUCK, args: tuple[str, ...] = ()) -> subprocess.Popen:
        p = subprocess.Popen(
            [*prefix, sys.executable, "-c", script, *args],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        started.append(p)
        assert p.stdout.readline().strip() == "ready"
        return p

    yield start
    for p in started:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait(timeout=10)


def make_run(
    root: Path,
    *,
    device: str = "cpu",
    nodes: int = 1,
    gpus_per_node: int = 2,
    hosts: tuple[str, ...] = (),
    nccl_env: dict | None = None,
) -> Path:
    """A run directory as the console writes it: run.toml (a shipped preset, resized) and state.json."""
    preset = "cpu-smoke" if device == "cpu" else "16gpu-h100"
    overrides = [f"topology.nodes={nodes}", f"topology.gpus_per_node={gpus_per_node}"]
    cfg = load_preset(preset, overrides=overrides).config
    if nccl_env is not None:
        cfg = cfg.model_copy(
            update={"distributed": cfg.distributed.model_copy(update={"nccl_env": nccl_env})}
        )
    run = root / f"run-{device}-{time.monotonic_ns()}"
    run.mkdir(parents=True)
    (run / "run.toml").write_text(config_to_toml(cfg))
    write_state(
        run / "state.json",
        RunState(run_id=run.name, phase=Phase.RUNNING, backend="ssh", hosts=hosts or ("localhost",) * nodes),
    )
    return run


def write_heartbeat(run: Path, rank: int, *, step: int, pid: int, host: str = "localhost") -> None:
    (run / "heartbeat").mkdir(exist_ok=True)
    (run / "heartbeat" / f"rank-{rank}.json").write_text(
        json.dumps({"step": step, "time": time.time(), "pid": pid, "host": host})
    )


def sigstop(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP and wait until the kernel shows the process stopped (delivery is asynchronous)."""
    from taehv_console.core.cluster.spawn import read_proc_one

    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while (entry := read_proc_one(pid)) is not None and entry[3] not in ("T", "t"):
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} did not stop within {timeout} s")
        time.sleep(0.01)
