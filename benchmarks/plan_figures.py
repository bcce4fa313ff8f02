"""Figures from the planner: the public arithmetic reproduced, derived configs for the issue's
topologies, the comparison table, and how long deriving and rendering take.

    .venv/bin/python benchmarks/plan_figures.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from taehv_console.core.plan.derive import auto_select, derive_run_config
from taehv_console.core.plan.planner import (
    bytes_per_optimizer_step,
    comm_fraction,
    compare_plans,
    make_plan,
    parse_bandwidth,
    usable_bytes_per_s,
)
from taehv_console.core.plan.presets import list_presets, load_preset
from taehv_console.core.plan.render import write_launch_files


def public_arithmetic() -> None:
    bps = usable_bytes_per_s(parse_bandwidth("1Gbit"))
    sync = bytes_per_optimizer_step(50.3e6, 2, None, 0, 1)
    print(f"50.3M params, fp16, 1 Gbit/s: {sync / 1e6:.1f} MB per sync, {sync / bps:.2f} s")
    for accum in (1, 4, 8, 16):
        print(f"  accumulation {accum:2}: {comm_fraction(sync / bps, accum):.0%} communication")
    syncs = 10_000 // 8
    print(
        f"  10,000 steps at 8: {syncs} syncs, {syncs * sync / 1e9:.1f} GB, {syncs * sync / bps / 60:.0f} min"
    )


def derived() -> None:
    base = load_preset("8gpu-h100")
    print("derived from 8gpu-h100 (batch x accum = effective, LR, warmup, checkpoint, ZeRO, timeout):")
    for nodes, gpus in ((4, 8), (3, 4), (1, 2), (16, 8)):
        c = derive_run_config(base, nodes, gpus).config
        print(
            f"  {nodes:2} x {gpus}: {c.optim.batch_per_gpu} x {c.optim.grad_accum} = {c.effective_batch:3}, "
            f"LR {c.optim.lr:g}, warmup {c.optim.warmup_steps}, ckpt {c.schedule.checkpoint_every}, "
            f"ZeRO-{c.deepspeed.zero_stage}, {c.distributed.collective_timeout_s} s"
        )


def comparison() -> None:
    presets = [p for p in list_presets().presets if p.config.topology.device == "cuda"]
    plans = [
        make_plan(
            p.config,
            name=p.name,
            gpu=p.meta.gpu,
            bandwidth_bits_per_s=parse_bandwidth(p.meta.network) if p.meta.network else None,
        )
        for p in presets
    ]
    plans.sort(key=lambda p: p.config.topology.world_size)
    rows = compare_plans(plans, next(p for p in plans if p.name == "8gpu-h100"))
    print("preset        world  step s  hours  GPU-h  speed-up  cost  comm   GB/GPU")
    for r in rows:
        p = r.plan
        print(
            f"  {p.name:11} {p.config.topology.world_size:5} {p.time.step_s:7.2f} {p.time.hours_to_max_steps:6.0f}"
            f" {p.time.gpu_hours:6.0f} {r.speedup:8.2f}x {r.relative_cost:5.2f} {p.comm.fraction:5.1%}"
            f" {p.memory.per_gpu_gb:6.1f}"
        )


def timings() -> None:
    base = load_preset("8gpu-h100")
    n = 200
    t = time.perf_counter()
    for _ in range(n):
        derive_run_config(base, 4, 8)
    print(f"derive_run_config: {(time.perf_counter() - t) / n * 1e3:.2f} ms")
    t = time.perf_counter()
    for _ in range(20):
        auto_select(4, 8, gpu_name="H100")
    print(f"auto_select (loads every preset): {(time.perf_counter() - t) / 20 * 1e3:.1f} ms")
    cfg = load_preset("64gpu-h100").config
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        for i in range(20):
            write_launch_files(cfg, Path(tmp) / str(i))
        print(f"write_launch_files (8 nodes, 13 files): {(time.perf_counter() - t) / 20 * 1e3:.1f} ms")


if __name__ == "__main__":
    public_arithmetic()
    derived()
    comparison()
    timings()
