"""Fixtures for run-control tests: run directories made by the real create_run, controllers whose
launchers are the fake torchrun in fake_launcher.py (real processes, sessions and signals; no
DeepSpeed), and an unrelated process of the same user that a stop must never touch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taehv_console.core.cluster.ssh import SshPool, SshSettings
from taehv_console.core.models import BackendKind
from taehv_console.core.plan.presets import load_preset
from taehv_console.core.run import supervision
from taehv_console.core.run.control import RunController
from taehv_console.core.run.create import LaunchSpec, create_run
from taehv_console.core.run.lock import read_holder
from taehv_console.core.run.rundir import RunDir
from tests.core.run.fake_launcher import fake_commands

FAKE = Path(__file__).with_name("fake_launcher.py")


def make_run(
    runs: Path,
    nodes: int = 2,
    per_node: int = 1,
    max_steps: int = 1000,
    env: dict | None = None,
    # the console's restarts are off unless a test asks for them: these tests are about one attempt
    overrides: tuple[str, ...] = ("recovery.max_restarts=0",),
) -> RunDir:
    cfg = load_preset(
        "cpu-smoke",
        overrides=[
            f"topology.nodes={nodes}",
            f"topology.gpus_per_node={per_node}",
            f"optim.max_steps={max_steps}",
            *overrides,
        ],
    ).config
    spec = LaunchSpec(
        backend=BackendKind.LOCAL,
        hosts=("localhost",) * nodes,
        master_addr="127.0.0.1",
        master_port=29999,
        env=env or {},
    )
    return create_run(runs, cfg, spec)


@pytest.fixture
def pool():
    with SshPool(SshSettings.from_env()) as p:
        yield p


@pytest.fixture
def launch_fake(tmp_path, pool):
    """launch_fake(nodes=2, per_node=1, max_steps=1000, step_s=0.2, env=None) -> a RunController
    with its fake launchers started; every controller is closed and its processes killed at the end."""
    made: list[RunController] = []

    def launch(
        nodes=2,
        per_node=1,
        max_steps=1000,
        step_s=0.2,
        env=None,
        grace_s=10.0,
        overrides=("recovery.max_restarts=0",),
    ) -> RunController:
        run = make_run(tmp_path / "runs", nodes, per_node, max_steps, env, tuple(overrides))
        ctrl = RunController.open(run, pool, purpose="test")
        ctrl.grace_s = grace_s
        fake_commands(ctrl, per_node, max_steps, step_s)
        ctrl.launch()
        made.append(ctrl)
        return ctrl

    yield launch
    for ctrl in made:
        try:
            if ctrl.attempt and ctrl.attempt.nodes:
                ctrl.backend.kill(ctrl.run, ctrl.attempt)  # by recorded pgid, as everywhere
        finally:
            ctrl.close()


@pytest.fixture
def unrelated_sleeper():
    """A process of the same user in a session of its own, started like any other job on the node."""
    proc = subprocess.Popen(["sleep", "600"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def rank_pid(run: RunDir, rank: int) -> int:
    # ranks beat on their own schedule: rank 0's step says nothing about rank 1's first heartbeat
    path = run.heartbeats / f"rank-{rank}.json"
    wait_for(path.exists, 20, f"rank {rank}'s heartbeat")
    return json.loads(path.read_text())["pid"]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def step_of(ctrl: RunController) -> int:
    ctrl._tail().poll()
    return ctrl._tail().progress.step


def start_console(
    run: RunDir, max_steps: int = 1000, step_s: float = 0.2, ranks: int = 1
) -> subprocess.Popen:
    """A separate console process that launches and follows `run` (tests SIGKILL it)."""
    root = Path(__file__).resolve().parents[3]
    return subprocess.Popen(
        [
            sys.executable,
            str(FAKE),
            "console",
            "--run",
            str(run.path),
            "--ranks",
            str(ranks),
            "--max-steps",
            str(max_steps),
            "--step-s",
            str(step_s),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(root)},
    )


def launch_then_kill_console(run: RunDir, max_steps: int, step_s: float) -> None:
    """A separate console launches `run`; once rank 0 has written a step, the console is SIGKILLed
    (its launchers run on in sessions of their own)."""
    console = start_console(run, max_steps=max_steps, step_s=step_s)
    try:
        assert console.stdout.readline().strip() == "launched"
        wait_for(
            lambda: run.event_file(0).exists() and '"step"' in run.event_file(0).read_text(), 30, "a step"
        )
    finally:
        kill_console(console)


def kill_console(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the console's own session: it never holds the run's launchers
    proc.wait()


def start_supervisor(run: RunDir, max_steps: int, step_s: float) -> subprocess.Popen:
    log = open(supervision.log_path(run), "ab")  # the process's output, open for its life
    return subprocess.Popen(
        [
            sys.executable,
            str(FAKE),
            "supervise",
            "--run",
            str(run.path),
            "--ranks",
            "2",
            "--max-steps",
            str(max_steps),
            "--step-s",
            str(step_s),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).resolve().parents[3],
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])},
    )


@pytest.fixture
def supervised_run(tmp_path):
    """A run with restarts on, launched by a console process, and its supervisor in standby.
    Everything is killed at the end, the supervisor by its own session."""
    procs: list[subprocess.Popen] = []

    def make(max_steps: int = 40, step_s: float = 0.15) -> tuple[RunDir, subprocess.Popen, subprocess.Popen]:
        run = make_run(
            tmp_path / "runs",
            nodes=1,
            per_node=2,
            max_steps=max_steps,
            env={"FAKE_CKPT_EVERY": "3"},
            overrides=("recovery.max_restarts=2", "recovery.backoff_s=0.5"),
        )
        console = start_console(run, max_steps=max_steps, step_s=step_s, ranks=2)
        assert console.stdout.readline().strip() == "launched"
        sup = start_supervisor(run, max_steps, step_s)
        procs.extend([console, sup])
        return run, console, sup

    yield make
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def holder(run: RunDir) -> str:
    return str(read_holder(run.lock_path).get("purpose", ""))
