"""What trains: the DeepSpeed engine around TAEHV with its optimizer, and the pieces that move with
it (the EMA of the master weights, the discriminator, the teacher on this rank's device)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from deepspeed import DeepSpeedEngine
from deepspeed.checkpoint.constants import (
    UNIVERSAL_CHECKPOINT_INFO,
    UNIVERSAL_CHECKPOINT_VERSION_KEY,
    UNIVERSAL_CHECKPOINT_VERSION_VALUE,
)
from safetensors.torch import load_file

from trainer import checkpoint as ckpt
from trainer.compile_cache import CompileCache, open_cache
from trainer.config import TrainConfig
from trainer.discriminator import Adversary
from trainer.ds_config import deepspeed_skips_nonfinite_step, effective_deepspeed_config
from trainer.events import atomic_write_json
from trainer.master_weights import MasterEMA, full_fp32_weights
from trainer.model import TAEHV, build_model
from trainer.optim import AdamW
from trainer.runtime import Runtime
from trainer.state import lr_at
from trainer.teacher import place_teacher


@dataclass
class Learner:
    engine: DeepSpeedEngine  # accelerate's prepared model
    optimizer: Any  # accelerate's wrapper of DeepSpeed's optimizer
    zero_stage: int
    ema: MasterEMA | None
    adversary: Adversary | None
    teacher: torch.nn.Module | None
    # Who keeps a non-finite loss out of the weights. DeepSpeed's ZeRO optimizers under bf16 or fp16
    # check the gradients at the optimizer step and skip the whole step (engine.skipped_steps), so the
    # trainer need not look at the loss on the host between forward and backward: no host
    # synchronisation per micro-batch. Elsewhere (fp32, where DeepSpeed checks nothing; a ZeRO-3 that
    # checks only fp16; the discriminator, which DeepSpeed does not step) the trainer checks each
    # micro-batch's loss and skips it on every rank.
    nonfinite_guard: str
    # the run's compile cache (trainer.compile_cache), loaded before the first compile; None uncompiled
    compile_cache: CompileCache | None = None
    # The whole weights last gathered (use_ema -> (optimizer step, tensors)). A step's saves come
    # together: validation's best/ export, the checkpoint and the final export, each a gather of one
    # collective per parameter; the weights cannot change until the next optimizer step.
    _gathered: dict[bool, tuple[int, dict[str, torch.Tensor]]] = field(default_factory=dict)

    @property
    def module(self) -> TAEHV:
        return self.engine.module

    @property
    def parts(self) -> tuple[str, ...]:
        """Optional parts this run's checkpoints carry (trainer.checkpoint.PART_FILES)."""
        return ("discriminator",) if self.adversary is not None else ()

    def full_weights(self, use_ema: bool = False) -> dict[str, torch.Tensor]:
        """Full fp32 tensors from the optimizer's master weights (not the module's bf16 copies).
        Collective: every rank must call it (each gathers at the same calls: the first at a step);
        only rank 0's are whole. Callers read the tensors and do not change them."""
        step = int(self.engine.global_steps)
        cached = self._gathered.get(use_ema)
        if cached is not None and cached[0] == step:
            return cached[1]
        if use_ema:
            assert self.ema is not None  # callers ask for the EMA only when there is one
            weights = self.ema.full_weights()
        else:
            weights = full_fp32_weights(self.engine)
        self._gathered[use_ema] = (step, weights)
        return weights


def run_deepspeed_hooks_eagerly(module: torch.nn.Module) -> int:
    """Wrap each forward hook DeepSpeed put on `module`'s submodules in torch.compiler.disable, and
    say how many. ZeRO-3 hooks every module, inside the compiled stages. Dynamo traced two of the
    four (the post-forward hook and the pre-backward one) at each module it met, compiled them again
    for each module type and each grad mode, and gave up at its recompile limit with a warning in
    every rank's log. Run eagerly they do exactly what they do in an eager step, and a stage still
    breaks at each hook: on CPU (4x32x32, batch 2) the two warm-up steps took 9.6 s instead of 28.2 s
    and a step 478 ms instead of 607 (docs/performance.md)."""
    wrapped = 0
    for sub in module.modules():
        for hooks in (sub._forward_pre_hooks, sub._forward_hooks):
            for key, fn in list(hooks.items()):
                if getattr(fn, "__module__", "").startswith("deepspeed."):
                    # same key: the hook's handle still removes it, its kwargs/always-call flags hold
                    hooks[key] = torch.compiler.disable(fn)
                    wrapped += 1
    return wrapped


def build_learner(
    rt: Runtime,
    cfg: TrainConfig,
    resume_from: ckpt.CheckpointStatus | None,
    universal: bool,
    weights_only: bool,
    teacher_cpu: torch.nn.Module | None,
) -> Learner:
    """The model, optimizer and engine, with a weights-only resume from `resume_from` already loaded
    into the model; `universal`: a universal checkpoint will load. A full resume is loaded afterwards
    by the checkpoint manager, into the engine."""
    torch.manual_seed(cfg.run.seed)
    model = build_model(cfg.model)
    if resume_from and weights_only:
        model.load_state_dict(load_file(str(resume_from.path / ckpt.WEIGHTS)))
    # saved into every checkpoint: what ds_to_universal needs to convert it for another world size
    setattr(
        model,
        UNIVERSAL_CHECKPOINT_INFO,
        {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE},
    )
    if universal:
        # DeepSpeed reads this when load_checkpoint runs; accelerate keeps its own copy of the config
        rt.accelerator.state.deepspeed_plugin.deepspeed_config["checkpoint"] = {"load_universal": True}
    compile_cache = None
    if cfg.model.compile:
        # each encoder/decoder stage: decode on teacher latents runs compiled too; from the run's
        # cache where a rank (of this attempt or an earlier one, on any node) compiled them before
        compile_cache = open_cache(rt.run_dir, rt.device, writer=rt.is_main)
        if compile_cache.error:
            rt.log.warning(f"compile cache: {compile_cache.error}")
        model.compile_stages(mode=cfg.model.compile_mode)
    teacher = None
    if teacher_cpu is not None:
        teacher = place_teacher(
            teacher_cpu, rt.device, torch.bfloat16 if rt.precision == "bf16" else torch.float32
        )
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    optimizer = AdamW(
        [
            {"params": decay, "weight_decay": cfg.optim.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=lr_at(0, cfg),
        betas=cfg.optim.betas,
        eps=cfg.optim.eps,
        # one kernel per step over ZeRO's flat fp32 partition, on GPU and CPU: torch's default on CPU
        # (a loop of elementwise ops) makes five partition-sized temporaries per step, 7x slower there
        # (benchmarks/optimizer_step.py)
        fused=True,
    )
    engine, optimizer = rt.accelerator.prepare(model, optimizer)
    zero_stage = int(rt.ds_config["zero_optimization"]["stage"])
    if cfg.model.compile and zero_stage == 3:
        hooks = run_deepspeed_hooks_eagerly(engine.module)
        rt.log.info(f"ZeRO-3 under torch.compile: DeepSpeed's {hooks} module hooks run eagerly, not traced")
    if rt.is_main:
        # what DeepSpeed really runs with, beside what was asked: a knob that never reached it shows here
        atomic_write_json(rt.run_dir / "deepspeed.effective.json", effective_deepspeed_config(engine))
    adversary = None
    if cfg.adversarial.weight > 0:
        adversary = Adversary(cfg.adversarial, cfg.model.latent_channels, rt.device, cfg.run.seed)
    return Learner(
        engine=engine,
        optimizer=optimizer,
        zero_stage=zero_stage,
        ema=MasterEMA(engine, cfg.optim.ema_decay) if cfg.optim.ema_decay > 0 else None,
        adversary=adversary,
        teacher=teacher,
        nonfinite_guard=(
            "deepspeed-step"
            if adversary is None and deepspeed_skips_nonfinite_step(zero_stage, rt.precision)
            else "micro-batch"
        ),
        compile_cache=compile_cache,
    )
