"""Checkpoints and failures: what a save costs, how often a run fails, what a failure loses, the
Young/Daly interval, and how a plan shows them (plain values and text)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from taehv_console.core.plan.footprint import parameter_count
from taehv_console.core.plan.memory import GB, MB, model_state_bytes
from taehv_console.core.values import InputError
from trainer.config import TrainConfig
from trainer.ds_config import resolve_precision

# Meta's Llama 3 report ("The Llama 3 Herd of Models", arXiv:2407.21783, section 3.3.4, Table 5):
# 419 unexpected interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs, i.e.
# 419 / (54 x 24 x 16,384) = 1.97e-5 per GPU-hour. The 47 planned interruptions are left out.
LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16_384
LLAMA3_FAILURES_PER_GPU_HOUR = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * 24 * LLAMA3_GPUS)
LLAMA3_SOURCE = (
    f"Meta's Llama 3 report, arXiv:2407.21783 section 3.3.4: {LLAMA3_INTERRUPTIONS} unexpected "
    f"interruptions in {LLAMA3_DAYS} days on {LLAMA3_GPUS:,} H100 GPUs"
)
# Shared storage the run directory lives on (NFS, Lustre, a cloud file share), as one stream:
# 1 GB/s is a modest figure for such storage, and every rank writes into the same directory.
STORAGE_BYTES_PER_S = 1 * GB
# A checkpoint crosses the storage twice: the ranks write it, then rank 0 reads every file back to
# hash it for the manifest (trainer/checkpoint.py finalize).
CHECKPOINT_STORAGE_PASSES = 2
# What a save costs whatever its size, an estimate (not measured on a GPU cluster): two barriers,
# DeepSpeed's save_checkpoint, gathering the fp32 and EMA weights parameter by parameter, fsync of
# every file and directory, the rename and `latest`.
CHECKPOINT_FIXED_S = 10.0
# From a failure to training again, an estimate: the console sees the failure (a dead process at
# once; a hang takes longer), tears the attempt down, waits recovery.backoff_s (10 s by default),
# relaunches (accelerate, DeepSpeed, NCCL) and verifies and loads the newest checkpoint.
RESTART_S = 120.0


def checkpoint_bytes(
    params: int, zero_stage: int, world_size: int, precision: str, ema: bool
) -> dict[str, float]:
    """Bytes one checkpoint writes, summed over the ranks, by part (trainer/checkpointing.py, CheckpointManager.save).

    - DeepSpeed's weights (2 B per parameter in bf16/fp16, 4 in fp32) and optimizer state (12 B:
      fp32 master + exp_avg + exp_avg_sq; 8 B in fp32), as `model_state_bytes` counts them: ZeRO
      splits these over the ranks' files but the sum is the same at every stage;
    - the consolidated fp32 weights (weights.safetensors): 4 B;
    - with EMA, each rank's fp32 EMA of its master partition (4 B in all under ZeRO 1-3, a whole
      copy per rank under stage 0) and the consolidated EMA weights: 4 B.
    Not counted: the discriminator (adversarial.weight > 0) and the small per-rank RNG state.
    """
    whole = model_state_bytes(params, 0, 1, precision)
    parts = {
        "weights": whole["weights"],
        "optimizer": whole["optimizer"],
        "weights_fp32": 4.0 * params,
    }
    if ema:
        parts["ema_state"] = 4.0 * params * (world_size if zero_stage == 0 else 1)
        parts["ema_weights_fp32"] = 4.0 * params
    return parts


def checkpoint_save_s(
    total_bytes: float,
    bytes_per_s: float = STORAGE_BYTES_PER_S,
    fixed_s: float = CHECKPOINT_FIXED_S,
    passes: int = CHECKPOINT_STORAGE_PASSES,
) -> float:
    """Seconds one save stops training, an estimate: passes x bytes / storage bandwidth + fixed_s."""
    return passes * total_bytes / bytes_per_s + fixed_s


def checkpoint_interval_s(every_steps: int, step_s: float) -> float:
    """Seconds between checkpoints: checkpoint_every x step time."""
    return every_steps * step_s


def cluster_mtbf_s(failures_per_gpu_hour: float, gpus: int) -> float:
    """The run's mean time between failures in seconds: 3600 / (rate per GPU-hour x GPUs). One
    failing GPU stops a synchronous run, so the rate grows with the number of GPUs."""
    if failures_per_gpu_hour <= 0 or gpus < 1:
        raise InputError(
            f"failure rate {failures_per_gpu_hour:g} per GPU-hour on {gpus} GPU(s): both more than 0"
        )
    return 3600 / (failures_per_gpu_hour * gpus)


def loss_per_failure_s(interval_s: float, restart_s: float = RESTART_S) -> float:
    """Seconds a failure costs on average: interval / 2 (the work since the last checkpoint, redone)
    + restart_s (detection, teardown, relaunch)."""
    return interval_s / 2 + restart_s


def expected_failures(run_s: float, mtbf_s: float) -> float:
    """Failures expected during a run: run time / MTBF."""
    return run_s / mtbf_s


def checkpoint_overhead_s(
    run_s: float, interval_s: float, save_s: float, mtbf_s: float, restart_s: float = RESTART_S
) -> float:
    """Seconds a run is expected to lose to checkpointing at this interval, first order:
    (run / interval) x save + (run / MTBF) x (interval / 2 + restart). The sum Young/Daly minimises."""
    saves = run_s / interval_s * save_s
    return saves + expected_failures(run_s, mtbf_s) * loss_per_failure_s(interval_s, restart_s)


def young_daly_interval_s(save_s: float, mtbf_s: float) -> float:
    """The checkpoint interval that loses least, Young's first-order optimum (Young 1974; Daly 2006):
    interval = sqrt(2 x save x MTBF). Valid while the save is short against the MTBF."""
    return math.sqrt(2 * save_s * mtbf_s)


def round_steps(steps: float, max_steps: int) -> int:
    """A step count to 2 significant digits (5,425 -> 5,400), at least 1, at most max_steps."""
    if steps < 1:
        return 1
    scale = 10 ** max(0, math.floor(math.log10(steps)) - 1)
    return max(1, min(round(steps / scale) * scale, max_steps))


@dataclass(frozen=True)
class CheckpointEstimate:
    """What a failure costs at the config's checkpoint interval, and the interval Young/Daly gives.

    Seconds of wall time; a GPU-hours figure is wall hours x `gpus` (every GPU waits or redoes).
    """

    every_steps: int
    interval_s: float
    bytes_by_part: dict[str, float] = field(hash=False)
    storage_bytes_per_s: float
    save_s: float  # an estimate: CHECKPOINT_STORAGE_PASSES x bytes / storage + CHECKPOINT_FIXED_S
    failures_per_gpu_hour: float
    failure_rate_source: str  # LLAMA3_SOURCE, or "given"
    gpus: int
    mtbf_s: float
    run_s: float  # to max steps, at the planned step time
    expected_failures: float  # during the run
    restart_s: float
    loss_per_failure_s: float  # interval / 2 + restart
    expected_loss_s: float  # expected failures x loss per failure
    save_overhead_s: float  # every save of the run: run / interval x save
    young_daly_s: float  # sqrt(2 x save x MTBF), before rounding to steps
    recommended_steps: int
    capped_at_max_steps: bool  # Young/Daly's interval is longer than the whole run
    recommended_interval_s: float  # recommended_steps x step time
    recommended_overhead_s: float  # saves + expected failure loss at the recommended interval
    saved_s: float  # overhead at the config's interval - at the recommended one

    @property
    def bytes(self) -> float:
        return sum(self.bytes_by_part.values())

    @property
    def overhead_s(self) -> float:
        return self.save_overhead_s + self.expected_loss_s

    def gpu_hours(self, seconds: float) -> float:
        return seconds * self.gpus / 3600


def estimate_checkpointing(
    cfg: TrainConfig,
    step_s: float,
    failures_per_gpu_hour: float | None = None,
    *,
    storage_bytes_per_s: float = STORAGE_BYTES_PER_S,
    restart_s: float = RESTART_S,
) -> CheckpointEstimate:
    """The checkpoint figures for `cfg` at `step_s` seconds per optimizer step; the failure rate per
    GPU-hour defaults to Llama 3's (LLAMA3_FAILURES_PER_GPU_HOUR)."""
    source = LLAMA3_SOURCE if failures_per_gpu_hour is None else "given"
    rate = LLAMA3_FAILURES_PER_GPU_HOUR if failures_per_gpu_hour is None else failures_per_gpu_hour
    gpus = cfg.topology.world_size
    parts = checkpoint_bytes(
        parameter_count(cfg.model).total,
        cfg.deepspeed.zero_stage,
        gpus,
        resolve_precision(cfg, cfg.topology.device),
        cfg.optim.ema_decay > 0,
    )
    save = checkpoint_save_s(sum(parts.values()), storage_bytes_per_s)
    mtbf = cluster_mtbf_s(rate, gpus)
    max_steps = cfg.optim.max_steps
    run_s = step_s * max_steps
    every = cfg.schedule.checkpoint_every
    interval = checkpoint_interval_s(every, step_s)
    per_failure = loss_per_failure_s(interval, restart_s)
    failures = expected_failures(run_s, mtbf)
    young = young_daly_interval_s(save, mtbf)
    capped = young / step_s > max_steps
    steps = round_steps(young / step_s, max_steps)
    recommended = checkpoint_interval_s(steps, step_s)
    overhead = checkpoint_overhead_s(run_s, interval, save, mtbf, restart_s)
    recommended_overhead = checkpoint_overhead_s(run_s, recommended, save, mtbf, restart_s)
    return CheckpointEstimate(
        every_steps=every,
        interval_s=interval,
        bytes_by_part=parts,
        storage_bytes_per_s=storage_bytes_per_s,
        save_s=save,
        failures_per_gpu_hour=rate,
        failure_rate_source=source,
        gpus=gpus,
        mtbf_s=mtbf,
        run_s=run_s,
        expected_failures=failures,
        restart_s=restart_s,
        loss_per_failure_s=per_failure,
        expected_loss_s=failures * per_failure,
        save_overhead_s=run_s / interval * save,
        young_daly_s=young,
        recommended_steps=steps,
        capped_at_max_steps=capped,
        recommended_interval_s=recommended,
        recommended_overhead_s=recommended_overhead,
        saved_s=overhead - recommended_overhead,
    )


def checkpoint_to_dict(c: CheckpointEstimate) -> dict:
    """The checkpoint figures as plain values (seconds, hours and GPU-hours side by side)."""

    def cost(seconds: float) -> dict[str, float]:
        return {"seconds": seconds, "hours": seconds / 3600, "gpu_hours": c.gpu_hours(seconds)}

    return {
        "every_steps": c.every_steps,
        "interval_s": c.interval_s,
        "interval_hours": c.interval_s / 3600,
        "save": {
            "estimate": True,
            "bytes": c.bytes,
            "bytes_by_part": dict(c.bytes_by_part),
            "storage_bytes_per_s": c.storage_bytes_per_s,
            "storage_passes": CHECKPOINT_STORAGE_PASSES,
            "fixed_s": CHECKPOINT_FIXED_S,
            "seconds": c.save_s,
            "formula": "passes x bytes / storage_bytes_per_s + fixed_s",
        },
        "failures": {
            "per_gpu_hour": c.failures_per_gpu_hour,
            "source": c.failure_rate_source,
            "gpus": c.gpus,
            "mtbf_hours": c.mtbf_s / 3600,
            "expected_in_run": c.expected_failures,
        },
        "restart_s": c.restart_s,
        "loss_per_failure": cost(c.loss_per_failure_s),
        "expected_loss": cost(c.expected_loss_s),
        "save_overhead": cost(c.save_overhead_s),
        "young_daly": {
            "formula": "sqrt(2 x save_s x mtbf_s)",
            "interval_s": c.young_daly_s,
            "every_steps": c.recommended_steps,
            "capped_at_max_steps": c.capped_at_max_steps,
            "recommended_interval_s": c.recommended_interval_s,
            "recommended_interval_hours": c.recommended_interval_s / 3600,
            "overhead": cost(c.recommended_overhead_s),
            "saved_vs_config": cost(c.saved_s),
        },
    }


def format_duration(seconds: float) -> str:
    """'45 s', '8.3 min', '2.22 h', '4.6 d': the unit that keeps the number readable."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.3g} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.3g} h"
    return f"{seconds / 86400:.3g} d"


def checkpoint_lines(c: CheckpointEstimate, unit: str = "GPU") -> list[str]:
    """The text a plan prints about checkpoints and failures (CLI, and the wizard's Review); `unit`
    is "GPU", or "process" for CPU runs."""
    if c.failure_rate_source == "given":
        source = f"given; Meta's Llama 3 report gives {LLAMA3_FAILURES_PER_GPU_HOUR:.3g}"
    else:
        source = f"from {c.failure_rate_source}"
    steps = f"every {c.recommended_steps:,} steps ({format_duration(c.recommended_interval_s)})"
    if c.recommended_steps == c.every_steps:
        verdict = f"{steps}, the config's interval"
    elif c.saved_s > 0:
        verdict = (
            f"{steps} would lose {format_duration(c.saved_s)} = {c.gpu_hours(c.saved_s):,.2f} {unit}-hours "
            f"less than every {c.every_steps:,}"
        )
    else:
        verdict = f"{steps}, no better than every {c.every_steps:,} (rounding)"
    if c.capped_at_max_steps:
        verdict += " (max_steps: Young/Daly's interval is longer than the run)"
    return [
        (
            f"every {c.every_steps:,} steps = {format_duration(c.interval_s)}; a save stops training "
            f"~{format_duration(c.save_s)} (estimate: {c.bytes / MB:,.0f} MB written and read back at "
            f"{c.storage_bytes_per_s / GB:g} GB/s + {CHECKPOINT_FIXED_S:g} s)"
        ),
        (
            f"failure rate {c.failures_per_gpu_hour:.3g} per {unit}-hour x {c.gpus} {unit}s: MTBF "
            f"{c.mtbf_s / 3600:,.0f} h, {c.expected_failures:.2g} failures expected in the run's "
            f"{format_duration(c.run_s)}"
        ),
        f"  ({source})",
        (
            f"a failure loses {format_duration(c.loss_per_failure_s)} = "
            f"{c.gpu_hours(c.loss_per_failure_s):,.1f} {unit}-hours on average (half an interval + "
            f"{format_duration(c.restart_s)} restart)"
        ),
        (
            f"expected over the run: {c.gpu_hours(c.expected_loss_s):,.2f} {unit}-hours lost to failures, "
            f"{c.gpu_hours(c.save_overhead_s):,.2f} to the saves themselves"
        ),
        f"Young/Daly sqrt(2 x save x MTBF) = {format_duration(c.young_daly_s)}: {verdict}",
    ]
