"""Median step time of the real trainer (accelerate + DeepSpeed ZeRO-2, one CPU process) against a
bare PyTorch loop over the same model, data and batch. Prints both and their ratio (target <= 1.10).

    .venv/bin/python benchmarks/trainer_overhead.py [--steps 30] [--size 64x96] [--frames 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def config(data: Path, steps: int, frames: int, h: int, w: int, batch: int) -> dict:
    return {
        "run": {"preset": "bench", "seed": 0},
        "topology": {"nodes": 1, "gpus_per_node": 1, "device": "cpu"},
        "data": {
            "source": str(data),
            "frames": frames,
            "height": h,
            "width": w,
            "num_workers": 1,
            "val_fraction": 0.0,
            "max_delta": 1,
        },
        "optim": {"batch_per_gpu": batch, "grad_accum": 1, "lr": 1e-4, "warmup_steps": 0, "max_steps": steps},
        "deepspeed": {"zero_stage": 2},
        "schedule": {"log_every": 10, "val_every": 10**6, "checkpoint_every": 10**6},
    }


def trainer_step_times(run: Path) -> list[float]:
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    subprocess.run(
        [sys.executable, "-m", "trainer.cli", "--run", str(run)],
        check=True,
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    lines = (run / "events" / "rank-0.jsonl").read_text().splitlines()
    return [e["step_time_s"] for e in map(json.loads, lines) if e["kind"] == "step"]


def bare_step_times(cfg_dict: dict) -> list[float]:
    import torch

    from trainer.config import config_from_dict
    from trainer.data import VideoClipDataset, find_videos, make_train_loader
    from trainer.model import build_model, reconstruction_target

    cfg = config_from_dict(cfg_dict)
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas, weight_decay=0.01)
    ds = VideoClipDataset(find_videos(cfg.data.source), cfg.data, train=True)
    loader = iter(
        make_train_loader(
            ds, 0, 1, 0, cfg.optim.batch_per_gpu, 0, cfg.data.num_workers, cfg.data.prefetch_factor
        )
    )
    times = []
    for _ in range(cfg.optim.max_steps):
        t0 = time.time()
        x = next(loader)["video"].float().div_(255)
        _z, y = model(x)
        loss = torch.nn.functional.mse_loss(y, reconstruction_target(x, y.shape[1]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss.item()
        times.append(time.time() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--size", default="64x96")
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--batch", type=int, default=2)
    args = ap.parse_args()
    h, w = map(int, args.size.split("x"))
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    from trainer.synthetic import make_synthetic

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_synthetic(tmp / "clips", clips=8, frames=args.frames + 4, height=h, width=w, seed=1)
        cfg = config(tmp / "clips", args.steps, args.frames, h, w, args.batch)
        run = tmp / "run"
        run.mkdir()
        (run / "run.toml").write_text(tomli_w.dumps(cfg))
        warm = 5  # first steps include DeepSpeed/allocator warm-up in both
        trainer = statistics.median(trainer_step_times(run)[warm:])
        bare = statistics.median(bare_step_times(cfg)[warm:])
    print(
        f"clip {args.frames}x{h}x{w}, batch {args.batch}, {args.steps} steps, 1 CPU process, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"bare PyTorch loop : median step {bare * 1000:8.1f} ms")
    print(f"taehv trainer     : median step {trainer * 1000:8.1f} ms")
    print(f"ratio trainer/bare: {trainer / bare:.3f}  (target <= 1.10)")


if __name__ == "__main__":
    main()
