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

from taehv_console.core.plan.render import LAUNCHER
from trainer.config import TrainConfig

BIN = Path(sys.executable).parent

# A run is waited for while it makes progress. Before its first step it only starts (imports,
# DeepSpeed's set-up, a checkpoint's load): QUIET_S without a file written is a hang. After that,
# STALL_STEPS of its own slowest step, when that is longer: a busy machine's steps are slow.
QUIET_S = 240.0
STALL_STEPS = 20
SCAN_S = 1.0

# bf16 on a CPU without native bf16 instructions (the AVX2-only machines CI can run on) computes
# convolutions ~15x slower than fp32: a 64x64 step took 43 s there, against 2.7 s in fp32. The bf16
# runs prove what bf16 changes (DeepSpeed's overflow check and skipped update, its BF16_Optimizer),
# not image quality, so they train on 16x16 crops (4 s a step).
BF16_CROP = {"height": 16, "width": 16}


def flat_grey_psnr(cfg: TrainConfig) -> float:
    """Mean PSNR of a flat mid-grey output (what a decoder that learned only the mean scores: `eval`'s
    mid_grey baseline) on the validation clips of `cfg`, as the trainer's validation cuts them.
    Imported here, not at the top: most users of this module only launch runs (no torch)."""
    from trainer.data import VideoClipDataset, find_videos, split_train_val, validation_items
    from trainer.evaluate import baselines

    _train, val = split_train_val(find_videos(cfg.data.source), cfg.data.val_fraction, cfg.data.val_max_clips)
    ds = VideoClipDataset(val, cfg.data, train=False)
    psnrs = [
        baselines(ds[(index, seed)]["video"].float() / 255)["mid_grey"].psnr
        for index, seed, _counts in validation_items(len(ds), 0, 1)
    ]
    return sum(psnrs) / len(psnrs)


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
            # 32x32 crops: a step costs ~1.4 s on a 2-core CI machine, against ~2.7 s at 64x64
            "height": 32,
            "width": 32,
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
            sys.executable,  # the interpreter the node wrapper runs render.LAUNCHER's "python" as
            *LAUNCHER[1:],
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

    def wait(self, timeout: float = QUIET_S) -> int:
        """The launcher's exit status. It is waited for as long as the run is making progress: it
        fails only when nothing in the run directory has changed for `timeout` seconds, or for
        STALL_STEPS of the run's slowest step so far when that is longer (a busy machine makes a
        run slow, not hung)."""
        try:
            wait_for(
                lambda: self.proc.poll() is not None, timeout, "the launcher to exit", run_dir=self.run_dir
            )
        except AssertionError as e:
            self.kill()
            raise AssertionError(f"run did not finish: {e}\nlog:\n{self.tail()}") from None
        return self.proc.returncode

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


def activity(run_dir: Path) -> tuple[int, int, int]:
    """(files, bytes, newest mtime) of what the run has written: events, logs, checkpoints,
    TensorBoard; heartbeats are left out, they go on while a rank is stuck."""
    files = size = newest = 0
    for root, dirs, names in os.walk(run_dir):
        dirs[:] = [d for d in dirs if d != "heartbeat"]
        for name in names:
            try:
                st = os.stat(os.path.join(root, name))
            except OSError:
                continue
            files += 1
            size += st.st_size
            newest = max(newest, st.st_mtime_ns)
    return files, size, newest


def slowest_step_s(run_dir: Path) -> float:
    """The longest step_time_s any rank has reported so far (0 before the first step)."""
    times = [
        e.get("step_time_s") or 0.0
        for path in (run_dir / "events").glob("rank-*.jsonl")
        for e in events(run_dir, int(path.stem.split("-")[1]), "step")
    ]
    return max(times, default=0.0)


def wait_for(
    predicate,
    timeout: float,
    what: str,
    launch: Launch | None = None,
    run_dir: Path | None = None,
):
    """predicate()'s first true value. With a run (`launch`, or `run_dir`) the wait lasts as long
    as the run makes progress: it fails when nothing in the run directory has changed for
    `timeout` seconds, or for STALL_STEPS of the slowest step so far when that is longer. Without
    one, `timeout` is a plain deadline."""
    run_dir = run_dir or (launch.run_dir if launch is not None else None)
    seen = activity(run_dir) if run_dir is not None else None
    moved = scanned = time.monotonic()
    quiet = float(timeout)
    while True:
        value = predicate()
        if value:
            return value
        if launch is not None and launch.proc.poll() is not None:
            raise AssertionError(
                f"launcher exited ({launch.proc.returncode}) before {what}:\n{launch.tail()}"
            )
        now = time.monotonic()
        # the run directory is walked (and its events read) once a second, not at every poll: at
        # 0.2 s that took a fifth of a core from the runs being waited for
        if run_dir is not None and now - scanned >= SCAN_S:
            scanned = now
            now_seen = activity(run_dir)
            if now_seen != seen:
                seen, moved = now_seen, now
                quiet = max(float(timeout), STALL_STEPS * slowest_step_s(run_dir))
        if now - moved > quiet:
            idle = f"nothing written in {run_dir} for {now - moved:.0f} s" if run_dir else f"{timeout} s"
            raise AssertionError(
                f"timed out waiting for {what} ({idle})" + (f":\n{launch.tail()}" if launch else "")
            )
        time.sleep(0.2)


def run_to_end(run_dir: Path, nprocs: int, args: tuple[str, ...] = (), env: dict | None = None) -> Launch:
    launch = Launch(run_dir, nprocs, args, env)
    rc = launch.wait()
    assert rc == 0, f"launcher exited {rc}:\n{launch.tail()}"
    return launch
