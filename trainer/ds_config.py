"""The DeepSpeed config built from a TrainConfig: one function used by the trainer and by `render`.

Every bucket size and stage-3 setting of the preset is written here explicitly, so nothing falls
back to a DeepSpeed default unseen (the public project's knobs never reached DeepSpeed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.config import TrainConfig

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine


def resolve_precision(cfg: TrainConfig, device: str) -> str:
    """'bf16', 'fp16' or 'no' (fp32). 'auto' is bf16 on GPU and fp32 on CPU."""
    mp = cfg.deepspeed.mixed_precision
    if mp == "auto":
        return "bf16" if device == "cuda" else "no"
    return mp


def deepspeed_skips_nonfinite_step(zero_stage: int, precision: str) -> bool:
    """Whether DeepSpeed itself skips an optimizer step whose gradients are not finite.

    ZeRO-1/2 do under fp16 and, with bf16.check_grad_overflow, under bf16. ZeRO-3 always does under
    fp16; under bf16 only where its step also treats a non-finite global gradient norm as an
    overflow. That arrived in a DeepSpeed release without a config key, so it is recognised by the
    check its stage-3 module imports (tests/trainer/test_training.py runs a NaN through it)."""
    if precision not in ("bf16", "fp16") or zero_stage not in (1, 2, 3):
        return False
    if zero_stage in (1, 2) or precision == "fp16":
        return True
    from deepspeed.runtime.zero import stage3

    return hasattr(stage3, "is_invalid_grad_norm")


def zero1_runs_bf16_optimizer(zero_stage: int, precision: str) -> bool:
    """Whether DeepSpeed runs ZeRO-1 as its BF16_Optimizer rather than the bucketed ZeRO optimizer.

    It does for bf16 weights with fp32 gradient accumulation, which build_deepspeed_config always
    asks for under bf16. BF16_Optimizer still partitions the fp32 master weights and AdamW state,
    but at the step the engine all-reduces the whole fp32 gradient buffer (cast to the
    communication dtype; 2(N-1)/N x gradient bytes) and then all-gathers the updated weights in
    allgather_bucket_size pieces; reduce_bucket_size and overlap_comm are not used."""
    return zero_stage == 1 and precision == "bf16"


def build_deepspeed_config(cfg: TrainConfig, device: str | None = None) -> dict:
    device = device or cfg.topology.device
    ds = cfg.deepspeed
    precision = resolve_precision(cfg, device)
    zero: dict = {
        "stage": ds.zero_stage,
        "allgather_partitions": True,
        "allgather_bucket_size": ds.allgather_bucket_size,
        "reduce_bucket_size": ds.reduce_bucket_size,
        "overlap_comm": ds.overlap_comm,
        "contiguous_gradients": ds.contiguous_gradients,
        "reduce_scatter": ds.reduce_scatter,
    }
    if ds.zero_stage == 3:
        zero.update(
            {
                "stage3_max_live_parameters": ds.stage3_max_live_parameters,
                "stage3_max_reuse_distance": ds.stage3_max_reuse_distance,
                "stage3_prefetch_bucket_size": ds.stage3_prefetch_bucket_size,
                "stage3_param_persistence_threshold": ds.stage3_param_persistence_threshold,
                # final weights are gathered by the trainer itself (GatheredParameters on all ranks)
                "stage3_gather_16bit_weights_on_model_save": False,
            }
        )
    conf: dict = {
        "train_micro_batch_size_per_gpu": cfg.optim.batch_per_gpu,
        "gradient_accumulation_steps": cfg.optim.grad_accum,
        "train_batch_size": cfg.effective_batch,
        "gradient_clipping": cfg.optim.grad_clip,
        "zero_optimization": zero,
        # check_grad_overflow: a non-finite gradient skips the step (the trainer relies on it to avoid
        # a host synchronisation per micro-batch: deepspeed_skips_nonfinite_step)
        "bf16": {"enabled": precision == "bf16", "check_grad_overflow": True},
        "fp16": {
            "enabled": precision == "fp16",
            "loss_scale": 0,
            "initial_scale_power": 16,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        },
        # the trainer logs; DeepSpeed's own per-step prints would only add noise to node logs
        "steps_per_print": 1_000_000_000,
        "wall_clock_breakdown": False,
    }
    if precision == "bf16":
        # Without this DeepSpeed sums micro-batch gradients in bf16 (8 mantissa bits): small
        # gradients vanish against large sums over grad_accum micro-batches. ZeRO-1/2/3 take it.
        conf["data_types"] = {"grad_accum_dtype": "fp32"}
    if ds.communication_data_type != "auto":
        conf["communication_data_type"] = ds.communication_data_type
    return conf


def effective_deepspeed_config(engine: DeepSpeedEngine) -> dict:
    """What the running DeepSpeed engine actually uses, read back from its parsed config, keyed
    like build_deepspeed_config so the two can be compared value by value."""
    c = engine._config  # DeepSpeed exposes no public accessor for the parsed config
    z = c.zero_config
    zero = {
        "stage": z.stage,
        "allgather_partitions": z.allgather_partitions,
        "allgather_bucket_size": z.allgather_bucket_size,
        "reduce_bucket_size": z.reduce_bucket_size,
        "overlap_comm": z.overlap_comm,
        "contiguous_gradients": z.contiguous_gradients,
        "reduce_scatter": z.reduce_scatter,
    }
    if z.stage == 3:
        zero.update(
            {
                "stage3_max_live_parameters": z.max_live_parameters,
                "stage3_max_reuse_distance": z.max_reuse_distance,
                "stage3_prefetch_bucket_size": z.prefetch_bucket_size,
                "stage3_param_persistence_threshold": z.param_persistence_threshold,
                "stage3_gather_16bit_weights_on_model_save": z.gather_16bit_weights_on_model_save,
            }
        )
    out = {
        "train_micro_batch_size_per_gpu": c.train_micro_batch_size_per_gpu,
        "gradient_accumulation_steps": c.gradient_accumulation_steps,
        "train_batch_size": c.train_batch_size,
        "gradient_clipping": c.gradient_clipping,
        "zero_optimization": zero,
        "bf16": {
            "enabled": bool(engine.bfloat16_enabled()),
            "check_grad_overflow": bool(c.bfloat16_config.check_grad_overflow),
        },
        "fp16_enabled": bool(engine.fp16_enabled()),
    }
    if c.grad_accum_dtype is not None:
        out["data_types"] = {"grad_accum_dtype": c.grad_accum_dtype}
    if c.communication_data_type is not None:
        out["communication_data_type"] = str(c.communication_data_type).replace("torch.", "")
    return out
