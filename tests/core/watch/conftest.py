"""Shared pieces for the watch tests: the recorded fixtures, a run directory written through the
trainer's own EventWriter (so the files have exactly the trainer's format), and a monitor config
with short intervals."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from taehv_console.core.watch.health import HealthPolicy
from taehv_console.core.watch.monitor import Monitor, MonitorConfig, PollerConfig
from trainer.events import EventWriter, atomic_write_text

FIXTURES = Path(__file__).parent / "fixtures"


def nvml_fixture(name: str) -> dict:
    return json.loads((FIXTURES / "nvml" / name).read_text())


def agent_line(name: str) -> str:
    return (FIXTURES / "agent" / name).read_text().strip()


def fast_config(**health) -> MonitorConfig:
    """Intervals a test can wait for; health thresholds scaled down the same way."""
    fast = PollerConfig(0.1, 10.0, 2.0)
    policy = HealthPolicy(
        **{
            "stall_floor_s": 0.5,
            "startup_grace_s": 30.0,
            "pause_grace_s": 5.0,
            "agent_timeout_s": 1.5,
            "agent_start_timeout_s": 15.0,
            **health,
        }
    )
    return MonitorConfig(
        events=fast,
        heartbeats=fast,
        logs=fast,
        checkpoints=PollerConfig(0.3, 10.0, 2.0),
        agents=fast,
        publish_interval_s=0.1,
        agent_interval_s=0.25,
        agent_restart_s=2.5,
        health=policy,
    )


def wait_state(mon: Monitor, predicate, timeout: float, what: str):
    """Poll the monitor's newest snapshot until predicate(state) is truthy; the state is returned."""
    deadline = time.time() + timeout
    state = mon.snapshot()
    while time.time() < deadline:
        state = mon.snapshot()
        if predicate(state):
            return state
        time.sleep(0.05)
    raise AssertionError(
        f"timed out after {timeout} s waiting for {what}; last state:\n"
        f"ranks={state.ranks}\nnodes={[(n.name, n.state, n.detail, n.agent) for n in state.nodes]}"
    )


class FakeRun:
    """A run directory fed by the trainer's EventWriter: steps with heartbeats, as ranks write them."""

    def __init__(self, run_dir: Path, world: int = 2, max_steps: int = 100, toml: str | None = None):
        self.dir = run_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "run.toml").write_text(
            toml
            or (
                f'[run]\npreset = "test"\n[optim]\nmax_steps = {max_steps}\n[schedule]\nval_every = 1000\n'
                f"checkpoint_every = 1000\n[topology]\nnodes = 1\ngpus_per_node = {world}\n"
            )
        )
        self.writers = [EventWriter(self.dir, r) for r in range(world)]
        self.world = world
        self.max_steps = max_steps
        self.step = 0

    def start(self, pids: list[int] | None = None) -> None:
        for w in self.writers:
            w.emit(
                "start",
                world_size=self.world,
                node="vm",
                local_rank=w.rank,
                preset="test",
                resumed_from=None,
                max_steps=self.max_steps,
                step=self.step,
            )
            self.beat(w.rank, pid=(pids or [os.getpid()] * self.world)[w.rank])

    def beat(self, rank: int, pid: int | None = None, **extra) -> None:
        beat = {"step": self.step, "time": time.time(), "pid": pid or os.getpid(), "host": "vm", **extra}
        atomic_write_text(self.dir / "heartbeat" / f"rank-{rank}.json", json.dumps(beat))

    def do_step(
        self,
        step_time: float = 0.2,
        waits: list[float] | None = None,
        pids: list[int] | None = None,
        ranks: list[int] | None = None,
    ) -> None:
        self.step += 1
        for w in self.writers:
            if ranks is not None and w.rank not in ranks:
                continue
            wait = (waits or [0.01] * self.world)[w.rank]
            self.beat(
                w.rank, pid=(pids or [os.getpid()] * self.world)[w.rank], step_time_s=step_time, wait_s=wait
            )
            if w.rank == 0:
                w.emit(
                    "step",
                    step=self.step,
                    loss=1.0 / self.step,
                    recon_loss=1.0 / self.step,
                    psnr=10.0 + self.step,
                    lr=1e-4,
                    grad_norm=1.0,
                    samples_per_s=8.0 / step_time,
                    step_time_s=step_time,
                    gpu_mem_gb=None,
                    nonfinite_skipped=0,
                )

    def stop(self, reason: str = "done") -> None:
        for w in self.writers:
            w.emit("stop", step=self.step, reason=reason, exit_status=0)
            self.beat(w.rank, stopped=True)

    def close(self) -> None:
        for w in self.writers:
            w.close()


@pytest.fixture
def fake_run(tmp_path):
    run = FakeRun(tmp_path / "run")
    yield run
    run.close()
