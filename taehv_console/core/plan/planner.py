"""Planner: one config's Plan (communication, time, cost, memory, teacher, checkpointing) and the
comparison of plans against a baseline, as the CLI, the wizard and --json show them.

Pure functions of a TrainConfig and a few stated assumptions (bandwidth, throughput); every
assumption is a named constant or argument so the figures can be checked by hand. Units: bytes,
seconds; "GB" and "MB" are decimal (1e9, 1e6), as the public arithmetic in FACTS.md uses them.
Each figure lives in its own module: memory, communication, zero (DeepSpeed's sizing), throughput,
teacher, checkpointing.
This module re-exports their public names, which callers import from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from taehv_console.core.plan.checkpointing import (
    CHECKPOINT_FIXED_S,
    CHECKPOINT_STORAGE_PASSES,
    LLAMA3_DAYS,
    LLAMA3_FAILURES_PER_GPU_HOUR,
    LLAMA3_GPUS,
    LLAMA3_INTERRUPTIONS,
    LLAMA3_SOURCE,
    RESTART_S,
    STORAGE_BYTES_PER_S,
    CheckpointEstimate,
    checkpoint_bytes,
    checkpoint_interval_s,
    checkpoint_lines,
    checkpoint_overhead_s,
    checkpoint_save_s,
    checkpoint_to_dict,
    cluster_mtbf_s,
    estimate_checkpointing,
    expected_failures,
    format_duration,
    loss_per_failure_s,
    round_steps,
    young_daly_interval_s,
)
from taehv_console.core.plan.communication import (
    INTER_NODE_DEFAULT,
    INTRA_NODE_BYTES_PER_S,
    INTRA_NODE_CPU_BYTES_PER_S,
    USABLE_LINK_FRACTION,
    CommEstimate,
    bytes_per_optimizer_step,
    comm_bytes_per_value,
    comm_fraction,
    format_bandwidth,
    link_for,
    parse_bandwidth,
    ring_factor,
    smallest_accumulation,
    usable_bytes_per_s,
)
from taehv_console.core.plan.footprint import parameter_count
from taehv_console.core.plan.memory import (
    FRAMEWORK_GB,
    GB,
    MB,
    WORKSPACE_FRACTION,
    MemoryFit,
    comm_buffer_bytes,
    estimate_memory,
    model_state_bytes,
)
from taehv_console.core.plan.teacher import (
    CACHE_BUILD_WINDOWS,
    DECODER_STEP_TFLOP,
    STUDENT_STEP_TFLOP,
    TEACHER_ENCODE_TFLOP,
    TeacherCost,
    teacher_cost,
    teacher_lines,
    teacher_to_dict,
)
from taehv_console.core.plan.throughput import (
    CLIPS_PER_S_PER_GPU,
    GPU_FAMILIES,
    REFERENCE_CLIP,
    TimeEstimate,
    assumed_throughput,
    gpu_family,
)
from taehv_console.core.plan.timeouts import explain_collective_timeout
from taehv_console.core.plan.zero import ZeroSizing, deepspeed_lines, size_zero, size_zero_for
from taehv_console.core.values import InputError
from trainer.config import TrainConfig
from trainer.ds_config import resolve_precision, zero1_runs_bf16_optimizer
from trainer.families import FAMILIES
from trainer.flops import flop_per_clip_step

__all__ = [
    "CACHE_BUILD_WINDOWS",
    "CHECKPOINT_FIXED_S",
    "CHECKPOINT_STORAGE_PASSES",
    "CLIPS_PER_S_PER_GPU",
    "DECODER_STEP_TFLOP",
    "FRAMEWORK_GB",
    "GB",
    "GPU_FAMILIES",
    "INTER_NODE_DEFAULT",
    "INTRA_NODE_BYTES_PER_S",
    "INTRA_NODE_CPU_BYTES_PER_S",
    "LLAMA3_DAYS",
    "LLAMA3_FAILURES_PER_GPU_HOUR",
    "LLAMA3_GPUS",
    "LLAMA3_INTERRUPTIONS",
    "LLAMA3_SOURCE",
    "MB",
    "REFERENCE_CLIP",
    "RESTART_S",
    "STORAGE_BYTES_PER_S",
    "STUDENT_STEP_TFLOP",
    "TEACHER_ENCODE_TFLOP",
    "USABLE_LINK_FRACTION",
    "WORKSPACE_FRACTION",
    "CheckpointEstimate",
    "CommEstimate",
    "ComparisonRow",
    "MemoryFit",
    "Plan",
    "TeacherCost",
    "TimeEstimate",
    "ZeroSizing",
    "assumed_throughput",
    "bytes_per_optimizer_step",
    "checkpoint_bytes",
    "checkpoint_interval_s",
    "checkpoint_lines",
    "checkpoint_overhead_s",
    "checkpoint_save_s",
    "checkpoint_to_dict",
    "cluster_mtbf_s",
    "comm_buffer_bytes",
    "comm_bytes_per_value",
    "comm_fraction",
    "compare_plans",
    "deepspeed_lines",
    "estimate_checkpointing",
    "estimate_memory",
    "expected_failures",
    "format_bandwidth",
    "format_duration",
    "gpu_family",
    "link_for",
    "loss_per_failure_s",
    "make_plan",
    "model_state_bytes",
    "model_summary",
    "parse_bandwidth",
    "plan_to_dict",
    "ring_factor",
    "round_steps",
    "size_zero",
    "size_zero_for",
    "smallest_accumulation",
    "teacher_cost",
    "teacher_lines",
    "teacher_to_dict",
    "usable_bytes_per_s",
    "young_daly_interval_s",
]


@dataclass(frozen=True)
class Plan:
    name: str
    config: TrainConfig
    comm: CommEstimate
    time: TimeEstimate
    memory: MemoryFit
    assumptions: tuple[str, ...]
    teacher: TeacherCost | None = None
    collective_timeout: str = ""  # the timeout and why (derived configs wait minutes, not hours)
    checkpoint: CheckpointEstimate | None = None  # what a failure costs, and the interval to save at
    deepspeed: tuple[str, ...] = ()  # what its ZeRO stage and buckets cost, and how they would be sized


def make_plan(
    cfg: TrainConfig,
    *,
    name: str = "",
    gpu: str = "",
    bandwidth_bits_per_s: float | None = None,
    clips_per_s_per_gpu: float | None = None,
    efficiency: float = 1.0,
    target_fraction: float = 0.1,
    price_per_gpu_hour: float | None = None,
    failures_per_gpu_hour: float | None = None,
) -> Plan:
    """Communication, time, cost and memory for one config.

    Step time = accumulation x micro-batch / (throughput x efficiency) + communication, with no
    overlap of the two (the public arithmetic's convention; overlap_comm can only make it faster).
    Communication crosses the inter-node link when there are several nodes (the ring passes each
    node boundary with the full per-GPU volume), else NVLink (or gloo for CPU processes).
    Checkpointing (`estimate_checkpointing`) at that step time, with `failures_per_gpu_hour`
    interruptions per GPU-hour (None: Llama 3's, LLAMA3_FAILURES_PER_GPU_HOUR).
    """
    if not 0 < efficiency <= 1:
        raise InputError(f"efficiency {efficiency}: must be in (0, 1]")
    assumptions: list[str] = []
    t = cfg.topology
    params = parameter_count(cfg.model).total
    bpv = comm_bytes_per_value(cfg)

    bps, link, link_why = link_for(t.nodes, t.device, bandwidth_bits_per_s)
    assumptions.append(link_why)

    if clips_per_s_per_gpu is None:
        clips_per_s_per_gpu, why = assumed_throughput(cfg, gpu)
        assumptions.append(why)
    else:
        assumptions.append(f"throughput {clips_per_s_per_gpu:g} clips/s per GPU (given)")
    if efficiency < 1:
        assumptions.append(f"scaling efficiency {efficiency:g} on compute")

    micro_s = cfg.optim.batch_per_gpu / (clips_per_s_per_gpu * efficiency)
    compute_s = cfg.optim.grad_accum * micro_s
    bf16_zero1 = zero1_runs_bf16_optimizer(cfg.deepspeed.zero_stage, resolve_precision(cfg, t.device))
    step_bytes = bytes_per_optimizer_step(
        params, bpv, t.world_size, cfg.deepspeed.zero_stage, cfg.optim.grad_accum, bf16_zero1=bf16_zero1
    )
    comm_s = step_bytes / bps
    comm = CommEstimate(
        bytes_per_step=step_bytes,
        bytes_per_s=bps,
        link=link,
        seconds_per_step=comm_s,
        fraction=comm_fraction(comm_s, compute_s),
        smallest_accum_under_target=smallest_accumulation(
            target_fraction,
            params=params,
            bytes_per_value=bpv,
            world_size=t.world_size,
            zero_stage=cfg.deepspeed.zero_stage,
            compute_s_per_micro_step=micro_s,
            bytes_per_s=bps,
            bf16_zero1=bf16_zero1,
        ),
        target_fraction=target_fraction,
    )
    teacher = teacher_cost(cfg, compute_s, comm_s, clips_per_s_per_gpu * efficiency)
    step_s = compute_s + comm_s
    if teacher.mode != "off":
        step_s = teacher.online_step_s if teacher.mode == "online" else teacher.cached_step_s
        compute_s = step_s - comm_s
        assumptions.append(
            f"teacher VAE {teacher.mode} ({teacher.family}'s, {teacher.teacher_class}): its encode "
            f"({teacher.encode_tflop:.3g} TFLOP per clip) is {teacher.encode_ratio:.1f}x the student's "
            f"{teacher.student_step_tflop:.3g} TFLOP step, at the student's rate"
            + (f" ({teacher.note})" if teacher.note else "")
            + (
                f"; the decoder's pass on teacher latents adds {teacher.decoder_ratio:.2f}x"
                if teacher.decoder_ratio
                else ""
            )
            + ("; cached: paid once by cache-latents" if teacher.mode == "cached" else "")
        )
    hours = step_s * cfg.optim.max_steps / 3600
    gpu_hours = hours * t.world_size
    time = TimeEstimate(
        clips_per_s_per_gpu=clips_per_s_per_gpu,
        compute_s_per_step=compute_s,
        step_s=step_s,
        clips_per_s=cfg.effective_batch / step_s,
        hours_to_max_steps=hours,
        gpu_hours=gpu_hours,
        cost=gpu_hours * price_per_gpu_hour if price_per_gpu_hour is not None else None,
    )
    return Plan(
        name=name or cfg.run.preset,
        config=cfg,
        comm=comm,
        time=time,
        memory=estimate_memory(cfg),
        assumptions=tuple(assumptions),
        teacher=teacher,
        collective_timeout=explain_collective_timeout(cfg),
        checkpoint=estimate_checkpointing(cfg, step_s, failures_per_gpu_hour),
        deepspeed=deepspeed_lines(cfg, bps, link),
    )


def model_summary(cfg: TrainConfig) -> dict[str, Any]:
    """The model a plan's figures are of: its family (and the video model it serves), parameters and
    FLOPs per clip-step at the config's clip (trainer/flops.py, the count the trainer's MFU uses)."""
    m, d = cfg.model, cfg.data
    fam = FAMILIES.get(m.family)
    return {
        "family": m.family,
        "serves": fam.serves if fam is not None else "custom shapes",
        "parameters": parameter_count(m).total,
        "clip": [d.frames, d.height, d.width],
        "tflop_per_clip_step": flop_per_clip_step(d.frames, d.height, d.width, model=m) / 1e12,
    }


@dataclass(frozen=True)
class ComparisonRow:
    plan: Plan
    speedup: float  # baseline hours / these hours
    relative_cost: float  # these GPU-hours / baseline GPU-hours


def compare_plans(plans: list[Plan], baseline: Plan) -> list[ComparisonRow]:
    """The public comparison table's shape: time, GPU-hours, speed-up and cost against a baseline."""
    b = baseline.time
    return [
        ComparisonRow(
            plan=p,
            speedup=b.hours_to_max_steps / p.time.hours_to_max_steps,
            relative_cost=p.time.gpu_hours / b.gpu_hours,
        )
        for p in plans
    ]


def plan_to_dict(plan: Plan, row: ComparisonRow | None = None) -> dict:
    """A JSON-ready view of a plan (the CLI's --json and anything else that wants plain values)."""
    c = plan.config
    t = c.topology
    out: dict[str, Any] = {
        "name": plan.name,
        "topology": {
            "nodes": t.nodes,
            "gpus_per_node": t.gpus_per_node,
            "world_size": t.world_size,
            "device": t.device,
        },
        "batch": {
            "per_gpu": c.optim.batch_per_gpu,
            "grad_accum": c.optim.grad_accum,
            "effective": c.effective_batch,
        },
        "zero_stage": c.deepspeed.zero_stage,
        "model": model_summary(c),
        "collective_timeout": {"seconds": c.distributed.collective_timeout_s, "why": plan.collective_timeout},
        "communication": {
            "bytes_per_step": plan.comm.bytes_per_step,
            "link": plan.comm.link,
            "usable_bytes_per_s": plan.comm.bytes_per_s,
            "seconds_per_step": plan.comm.seconds_per_step,
            "fraction": plan.comm.fraction,
            "target_fraction": plan.comm.target_fraction,
            "smallest_accum_under_target": plan.comm.smallest_accum_under_target,
        },
        "time": {
            "clips_per_s_per_gpu": plan.time.clips_per_s_per_gpu,
            "compute_s_per_step": plan.time.compute_s_per_step,
            "step_s": plan.time.step_s,
            "clips_per_s": plan.time.clips_per_s,
            "max_steps": c.optim.max_steps,
            "hours_to_max_steps": plan.time.hours_to_max_steps,
            "gpu_hours": plan.time.gpu_hours,
            "cost": plan.time.cost,
        },
        "memory": {
            "fits": plan.memory.fits,
            "per_gpu_gb": plan.memory.per_gpu_gb,
            "gpu_gb": plan.memory.gpu_gb,
            "breakdown_gb": dict(plan.memory.breakdown),
            "max_batch_per_gpu": plan.memory.max_batch_per_gpu,
            "notes": list(plan.memory.notes),
        },
        "deepspeed": list(plan.deepspeed),
        "assumptions": list(plan.assumptions),
    }
    if plan.teacher is not None:
        out["teacher"] = teacher_to_dict(plan.teacher)
    if plan.checkpoint is not None:
        out["checkpointing"] = checkpoint_to_dict(plan.checkpoint)
    if row is not None:
        out["speedup_vs_baseline"] = row.speedup
        out["relative_cost_vs_baseline"] = row.relative_cost
    return out
