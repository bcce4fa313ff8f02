"""Helpers for real multi-process training runs on CPU: run directories and an `accelerate launch`
of the trainer exactly as a node runs it (DeepSpeed, gloo, 1 or 2 processes)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import tomli_w

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_config(data_source: Path, **sections) -> dict:
    cfg = {
        "run": {"preset": "test", "seed": 42},
        "topology": {"nodes": 1, "gpus_per_node": 2, "device": "cpu"},
        "data": {
            "source": str(data_source),
            "frames": 8,
            "height": 64,
            "width": 64,
            "num_workers": 0,
            "val_fraction": 0.25,
            "max_delta": 1,
        },
        "optim": {"batch_per_gpu": 1, "grad_accum": 2, "lr": 2e-3, "warmup_steps": 2, "max_steps": 6},
        "deepspeed": {"zero_stage": 2},
        "schedule": {"log_every": 1, "val_every": 3, "checkpoint_every": 3, "keep_checkpoints": 2},
    }
    for name, values in sections.items():
        cfg.setdefault(name, {}).update(values)
    return cfg


def write_run(run_dir: Path, cfg: dict) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.toml").write_text(tomli_w.dumps(cfg))
    return run_dir


class Launch:
    """One node's launcher (`accelerate launch` → torchrun → N trainer ranks) in its own session."""

    def __init__(self, run_dir: Path, nprocs: int, args: tuple[str, ...] = (), env: dict | None = None):
        self.run_dir = run_dir
        self.log = run_dir / "launcher.log"
        cmd = [
            str(BIN / "accelerate"),
            "launch",
            "--use_deepspeed",
            "--num_processes",
            str(nprocs),
            "--num_machines",
            "1",
            "--machine_rank",
            "0",
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            str(free_port()),
            "--deepspeed_multinode_launcher",
            "standard",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "-m",
            "trainer.cli",
            "--run",
            str(run_dir),
            *args,
        ]
        full_env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", **(env or {})}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=full_env,
                start_new_session=True,
            )

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"run did not finish in {timeout}s; log:\n{self.tail()}") from None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])


def events(run_dir: Path, rank: int = 0, kind: str | None = None) -> list[dict]:
    path = run_dir / "events" / f"rank-{rank}.jsonl"
    if not path.exists():
        return []
    out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in out if kind is None or e["kind"] == kind]


def wait_for(predicate, timeout: float, what: str, launch: Launch | None = None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if launch is not None and launch.proc.poll() is not None:
            raise AssertionError(
                f"launcher exited ({launch.proc.returncode}) before {what}:\n{launch.tail()}"
            )
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f":\n{launch.tail()}" if launch else ""))


def run_to_end(run_dir: Path, nprocs: int, args: tuple[str, ...] = (), env: dict | None = None) -> Launch:
    launch = Launch(run_dir, nprocs, args, env)
    rc = launch.wait()
    assert rc == 0, f"launcher exited {rc}:\n{launch.tail()}"
    return launch
