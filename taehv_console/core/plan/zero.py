"""DeepSpeed sized from arithmetic: the ZeRO stage, the bucket size and overlap_comm for this
model's gradient and the link it crosses, each with its reason; and what a config's own choice
costs (bytes per step, HBM of the bucket buffers) set against the sized one.

The public presets sized DeepSpeed for a model ~1,000x larger: buckets of 5e8-1e9 elements hold
the whole 11.3M-element gradient in one bucket, so overlap_comm overlapped nothing while doubling
the bucket buffers (1-4 GB of HBM per GPU at those sizes); ZeRO-2 reduced gradients after every
micro-batch at accumulation 2, 8 and 32; ZeRO-3 saves a few MB on this model for 50% more bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from taehv_console.core.plan.communication import bytes_per_optimizer_step, comm_bytes_per_value, link_for
from taehv_console.core.plan.footprint import parameter_count
from taehv_console.core.plan.memory import MB, bucket_buffer_bytes, model_state_bytes, round_up_bucket
from trainer.config import TrainConfig
from trainer.ds_config import resolve_precision, zero1_runs_bf16_optimizer

# Across nodes the gradient goes in about this many buckets: the first ones are reduced over the
# slow link while backward still computes the rest (what overlap_comm is for) ...
BUCKETS_ACROSS_NODES = 4
# ... each a whole number of millions of elements, and at least one million: a 2 MB (bf16)
# message takes ~1 ms at 25 Gbit/s, long against the tens of microseconds a collective's start costs.
BUCKET_STEP = 1_000_000


@dataclass(frozen=True)
class ZeroSizing:
    """The stage, bucket size (elements, reduce = allgather) and overlap_comm, with their reasons."""

    stage: int
    bucket: int
    overlap: bool
    stage_why: str
    bucket_why: str
    overlap_why: str


def sized_bucket(params: int, nodes: int) -> int:
    """One node: one bucket holding the whole gradient (rounded up to 1/2/5 x 10^k); several nodes:
    the gradient in ~BUCKETS_ACROSS_NODES buckets of whole millions of elements."""
    if nodes == 1:
        return round_up_bucket(params)
    return max(BUCKET_STEP, math.ceil(params / BUCKETS_ACROSS_NODES / BUCKET_STEP) * BUCKET_STEP)


def zero_stage_for(
    grad_accum: int, bytes_zero1: float, bytes_zero2: float, world: int, bf16: bool = False
) -> tuple[int, str]:
    """ZeRO-1 when gradients are accumulated (reduced once per optimizer step), else ZeRO-2."""
    if grad_accum > 1:
        if world == 1:
            moved = "one process: nothing crosses a link, yet ZeRO-2 still runs its reduction each time"
        else:
            moved = f"{bytes_zero1 / MB:.1f} MB per GPU per step against ZeRO-2's {bytes_zero2 / MB:.1f} MB"
        how = (
            "; in bf16 DeepSpeed runs it as its BF16_Optimizer: one all-reduce of the accumulated gradient "
            "and one all-gather of the updated weights per step"
            if bf16
            else ""
        )
        return 1, (
            f"ZeRO-1: accumulation {grad_accum} > 1, and ZeRO-1 reduces gradients once per optimizer step, "
            f"not after each of the {grad_accum} micro-batches as ZeRO-2 does ({moved}){how}. AdamW state "
            "stays partitioned. ZeRO-3 would add two weight all-gathers per micro-batch to save a few MB "
            "on this 11.3M-parameter model; set deepspeed.zero_stage to insist on another stage"
        )
    return 2, (
        f"ZeRO-2: accumulation 1, so ZeRO-1 and ZeRO-2 both reduce once per step ({bytes_zero2 / MB:.1f} MB "
        "per GPU) and ZeRO-2 also partitions the gradients. ZeRO-3 (the public presets' choice from 2 "
        "nodes up) saves a few MB on this 11.3M-parameter model (~0.18 GB of weights, gradients and "
        "AdamW state per GPU unsharded) for 50% more bytes; set deepspeed.zero_stage=3 to insist"
    )


def size_zero(
    params: int,
    *,
    nodes: int,
    world: int,
    grad_accum: int,
    precision: str,
    bytes_per_value: int,
    bytes_per_s: float,
    link: str,
    stage: int | None = None,
    stage_why: str = "",
) -> ZeroSizing:
    """The ZeRO stage (unless `stage` is given, with `stage_why`), buckets and overlap for a gradient
    of `params` elements crossing `link` at `bytes_per_s`."""
    bf16 = precision == "bf16"
    if stage is None:
        b1 = bytes_per_optimizer_step(params, bytes_per_value, world, 1, grad_accum, bf16_zero1=bf16)
        b2 = bytes_per_optimizer_step(params, bytes_per_value, world, 2, grad_accum)
        stage, stage_why = zero_stage_for(grad_accum, b1, b2, world, bf16)
    bucket = sized_bucket(params, nodes)
    grad_ms = params * bytes_per_value / bytes_per_s * 1e3
    if nodes == 1:
        second = bucket_buffer_bytes(stage, bucket, True, precision, params=params) - bucket_buffer_bytes(
            stage, bucket, False, precision, params=params
        )
        bucket_why = (
            f"{bucket:.3g} elements: one bucket holds the whole {params:,}-element gradient (rounded up); "
            f"{link} moves it in {grad_ms:.2g} ms, so smaller buckets would only add collectives "
            f"(the public presets' 5e8-1e9 are {5e8 / params:.0f}-{1e9 / params:.0f}x the gradient)"
        )
        overlap = False
        overlap_why = "off: with one bucket there is nothing to overlap with backward" + (
            f"; on, it would add a second bucket buffer ({second / MB:.0f} MB per GPU) and a device "
            "synchronisation per micro-batch"
            if stage in (1, 2)
            else ""
        )
    else:
        count = math.ceil(params / bucket)
        bucket_why = (
            f"{bucket:.3g} elements ({bucket * bytes_per_value / MB:.0f} MB): the {params / 1e6:.1f}M-element "
            f"gradient in {count} buckets over {link}, each {bucket * bytes_per_value / bytes_per_s * 1e3:.1f} ms, "
            "long against a collective's start-up"
        )
        overlap = True
        overlap_why = (
            f"on: the whole gradient takes {grad_ms:.0f} ms over {link}; with {count} buckets all but the "
            "last are reduced while backward computes the rest"
        )
    if zero1_runs_bf16_optimizer(stage, precision):
        bucket_why += "; under bf16 ZeRO-1 (BF16_Optimizer) it sizes the weight all-gather only"
        overlap = False
        overlap_why = (
            "off: under bf16 ZeRO-1 DeepSpeed's BF16_Optimizer all-reduces the whole accumulated gradient "
            "at the step, after backward, so there is nothing to overlap"
        )
    return ZeroSizing(stage, bucket, overlap, stage_why, bucket_why, overlap_why)


def size_zero_for(cfg: TrainConfig, bytes_per_s: float, link: str, stage: int | None = None) -> ZeroSizing:
    """size_zero for a config's model, topology and accumulation (`stage`: None = by the rule)."""
    t = cfg.topology
    return size_zero(
        parameter_count(cfg.model).total,
        nodes=t.nodes,
        world=t.world_size,
        grad_accum=cfg.optim.grad_accum,
        precision=resolve_precision(cfg, t.device),
        bytes_per_value=comm_bytes_per_value(cfg),
        bytes_per_s=bytes_per_s,
        link=link,
        stage=stage,
        stage_why=f"ZeRO-{stage}: as set",
    )


# Stage-3 values by world size, as the public presets publish them: (up to this world, value)
MAX_LIVE_STEPS = ((16, 1_000_000_000), (48, 800_000_000), (None, 500_000_000))
PREFETCH_STEPS = ((16, 200_000_000), (48, 250_000_000), (None, 300_000_000))
PERSISTENCE_THRESHOLD = 100_000


def _by_world(world: int, steps: tuple[tuple[int | None, int], ...]) -> int:
    return next(value for limit, value in steps if limit is None or world <= limit)


def derive_deepspeed(
    src: TrainConfig,
    nodes: int,
    world: int,
    grad_accum: int,
    bandwidth_bits_per_s: float | None,
    asked_stage: int | None,
    base_name: str,
) -> list[tuple[str, Any, str]]:
    """(run.toml key, value, reason) for every DeepSpeed value derive sets: the stage (`asked_stage`,
    a user preset's own, is kept), buckets and overlap sized for `src`'s model on nodes x GPUs, and
    the published stage-3 values for the world size."""
    device = src.topology.device
    bps, link, _ = link_for(nodes, device, bandwidth_bits_per_s)
    sized = size_zero(
        parameter_count(src.model).total,
        nodes=nodes,
        world=world,
        grad_accum=grad_accum,
        precision=resolve_precision(src, device),
        bytes_per_value=comm_bytes_per_value(src),
        bytes_per_s=bps,
        link=link,
        stage=asked_stage,
        stage_why=f"ZeRO-{asked_stage}: your preset {base_name} asks for it",
    )
    s3 = "used only under ZeRO-3"
    live, pre = _by_world(world, MAX_LIVE_STEPS), _by_world(world, PREFETCH_STEPS)
    return [
        ("deepspeed.zero_stage", sized.stage, sized.stage_why),
        ("deepspeed.reduce_bucket_size", sized.bucket, sized.bucket_why),
        (
            "deepspeed.allgather_bucket_size",
            sized.bucket,
            "as reduce_bucket_size: one all-gather of the updated weights per bucket",
        ),
        ("deepspeed.overlap_comm", sized.overlap, sized.overlap_why),
        (
            "deepspeed.stage3_max_live_parameters",
            live,
            f"{live:.3g}: published 1e9/8e8/5e8 at 16/48/64 GPUs; {s3}",
        ),
        (
            "deepspeed.stage3_prefetch_bucket_size",
            pre,
            f"{pre:.3g}: published 2e8/2.5e8/3e8 at 16/48/64 GPUs; {s3}",
        ),
        (
            "deepspeed.stage3_param_persistence_threshold",
            PERSISTENCE_THRESHOLD,
            f"1e5: published for every ZeRO-3 preset; {s3}",
        ),
    ]


def _state_and_buffers(
    cfg: TrainConfig, params: int, stage: int, bucket: int, overlap: bool
) -> tuple[float, float]:
    precision = resolve_precision(cfg, cfg.topology.device)
    states = sum(model_state_bytes(params, stage, cfg.topology.world_size, precision).values())
    gathered = min(cfg.deepspeed.stage3_max_live_parameters, params) if stage == 3 else 0
    buffers = bucket_buffer_bytes(
        stage,
        bucket,
        overlap,
        precision,
        contiguous_gradients=cfg.deepspeed.contiguous_gradients,
        gathered=gathered,
        params=params,
    )
    return states, buffers


def deepspeed_lines(cfg: TrainConfig, bytes_per_s: float, link: str) -> tuple[str, ...]:
    """What this config's DeepSpeed settings cost (bytes per GPU per step, bucket buffers in HBM),
    and where the arithmetic sizes them differently, that choice with its reason."""
    ds, t = cfg.deepspeed, cfg.topology
    params = parameter_count(cfg.model).total
    bpv = comm_bytes_per_value(cfg)
    accum = cfg.optim.grad_accum

    precision = resolve_precision(cfg, t.device)

    def moved(stage: int) -> float:
        bf16_zero1 = zero1_runs_bf16_optimizer(stage, precision)
        return bytes_per_optimizer_step(params, bpv, t.world_size, stage, accum, bf16_zero1=bf16_zero1)

    _, buffers = _state_and_buffers(cfg, params, ds.zero_stage, ds.reduce_bucket_size, ds.overlap_comm)
    bf16_zero1 = zero1_runs_bf16_optimizer(ds.zero_stage, precision)
    count = math.ceil(params / ds.reduce_bucket_size)
    lines = [
        (
            f"ZeRO-{ds.zero_stage}, buckets of {ds.reduce_bucket_size:.3g} elements ({count} per gradient), "
            f"overlap_comm {'on' if ds.overlap_comm else 'off'}: {moved(ds.zero_stage) / MB:.1f} MB per GPU per "
            f"step, {'fp32 gradient buffer' if bf16_zero1 else 'bucket buffers'} {buffers / MB:,.0f} MB per GPU"
        )
    ]
    sized = size_zero_for(cfg, bytes_per_s, link, stage=ds.zero_stage)  # the buckets for its own stage
    if ds.zero_stage == 2 and accum > 1 and moved(2) > moved(1):
        lines.append(
            f"ZeRO-2 at accumulation {accum} reduces gradients after every micro-batch: "
            f"{moved(2) / MB:.1f} MB per GPU per step against {moved(1) / MB:.1f} MB under ZeRO-1 "
            "(--set deepspeed.zero_stage=1)"
        )
    if ds.zero_stage == 3:
        s3, buf3 = _state_and_buffers(cfg, params, 3, sized.bucket, sized.overlap)
        s2, buf2 = _state_and_buffers(cfg, params, 2, sized.bucket, sized.overlap)
        low = 1 if accum > 1 else 2
        net = s2 + buf2 - s3 - buf3
        lines.append(
            f"ZeRO-3 costs this {params / 1e6:.1f}M-parameter model {moved(3) / MB:.1f} MB per GPU per step "
            f"against {moved(low) / MB:.1f} MB under ZeRO-{low} (+{moved(3) / moved(low) - 1:.0%}: the weights "
            "all-gathered in forward and again in backward, with hooks on every module); in HBM it saves "
            f"{(s2 - s3) / MB:.0f} MB of weights and gradients per GPU but gathers into {buf3 / MB:.0f} MB of "
            f"buffers (ZeRO-2: {buf2 / MB:.0f} MB): {abs(net) / MB:.0f} MB {'less' if net >= 0 else 'more'} in all. "
            "Kept where a preset publishes it; --set deepspeed.zero_stage=2 to drop it"
        )
        compiled = compile_under_zero3(cfg)
        if compiled is not None:
            lines.append(f"{compiled[0]}: {compiled[1]}")
    if (sized.bucket, sized.overlap) != (ds.reduce_bucket_size, ds.overlap_comm):
        _, sized_buf = _state_and_buffers(cfg, params, ds.zero_stage, sized.bucket, sized.overlap)
        lines.append(
            f"sized for this gradient: buckets of {sized.bucket:.3g}, overlap_comm "
            f"{'on' if sized.overlap else 'off'}, {sized_buf / MB:,.0f} MB of buffers: {sized.bucket_why}; "
            f"overlap {sized.overlap_why}"
        )
    return tuple(lines)


def compile_under_zero3(cfg: TrainConfig) -> tuple[str, str] | None:
    """(what model.compile costs under ZeRO-3, the ways out), or None for a config that does not
    do both: plan's deepspeed line and preflight's warning. The figures are the trainer section of
    benchmarks/gpu_throughput.py on CPU (one rank, 4x32x32, batch 2, fp32)."""
    if not (cfg.model.compile and cfg.deepspeed.zero_stage == 3):
        return None
    why = (
        "model.compile under ZeRO-3: DeepSpeed's gather hooks on every module break each compiled "
        "stage into pieces (measured on CPU, the hooks run eagerly: 30 graph breaks, a step 1.2x the "
        "eager ZeRO-3 step and 1.9x the compiled ZeRO-2 one; not yet measured on a GPU)"
    )
    fix = (
        "--set deepspeed.zero_stage=2 (ZeRO-1/2 compile each stage whole), or --set model.compile=false "
        "to keep ZeRO-3"
    )
    return why, fix
