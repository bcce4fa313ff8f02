"""DeepSpeed communication per optimizer step and the HBM its buffers take, for the 8-, 16- and
64-GPU configs: before (the public presets' DeepSpeed values), the shipped presets now (published
ZeRO stage, buckets sized for the gradient) and what `auto` derives for the topology (stage sized
too). The planner's communication model (core/plan/communication.py, zero.py), no GPU needed.

    .venv/bin/python benchmarks/ds_comm.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from taehv_console.core.plan.derive import derive_run_config
from taehv_console.core.plan.planner import MB, link_for, make_plan, parse_bandwidth
from taehv_console.core.plan.presets import load_preset
from trainer.config import TrainConfig

# The public project's DeepSpeed values (FACTS.md): buckets (allgather = reduce), overlap on
PUBLISHED_BUCKETS = {"8gpu-h100": 500_000_000, "16gpu-h100": 500_000_000, "64gpu-h100": 1_000_000_000}


def published(cfg: TrainConfig, bucket: int) -> TrainConfig:
    ds = cfg.deepspeed.model_copy(
        update={"reduce_bucket_size": bucket, "allgather_bucket_size": bucket, "overlap_comm": True}
    )
    return cfg.model_copy(update={"deepspeed": ds})


def row(label: str, cfg: TrainConfig, bandwidth: float | None) -> str:
    plan = make_plan(cfg, bandwidth_bits_per_s=bandwidth)
    ds = cfg.deepspeed
    buffers = plan.memory.breakdown["comm_buffers"] * 1e9
    return (
        f"  {label:<9} ZeRO-{ds.zero_stage} accum {cfg.optim.grad_accum:<2} bucket {ds.reduce_bucket_size:8.3g} "
        f"overlap {'on ' if ds.overlap_comm else 'off'}  {plan.comm.bytes_per_step / MB:6.1f} MB/GPU/step "
        f"{plan.comm.seconds_per_step * 1e3:7.2f} ms over {plan.comm.link:<18} buffers {buffers / MB:7,.0f} MB"
    )


def main() -> None:
    base = load_preset("8gpu-h100")
    for name, bucket in PUBLISHED_BUCKETS.items():
        preset = load_preset(name)
        t = preset.config.topology
        bandwidth = parse_bandwidth(preset.meta.network) if preset.meta.network else None
        _, link, _ = link_for(t.nodes, t.device, bandwidth)
        print(f"{name} ({t.nodes} x {t.gpus_per_node}, {link}):")
        print(row("before", published(preset.config, bucket), bandwidth))
        print(row("preset", preset.config, bandwidth))
        derived = derive_run_config(base, t.nodes, t.gpus_per_node).config
        print(row("derived", derived, bandwidth))
    print(
        "before: the public presets' stage and buckets; preset: the shipped file now (published stage, "
        "sized buckets);\nderived: what derive (auto, where no preset matches) chooses for the topology, stage included. "
        "bf16 throughout; buffers: the\nbucket buffers (ZeRO-1/2), gather + reduce buffers (ZeRO-3) or "
        "BF16_Optimizer's fp32 gradient buffer (bf16 ZeRO-1)."
    )


if __name__ == "__main__":
    main()
