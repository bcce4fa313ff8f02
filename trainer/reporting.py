"""What a rank tells about its training: the start event, the per-step heartbeat, and at log steps
the step event, TensorBoard's train/ scalars and the log line, from metrics kept on the device."""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.tensorboard import SummaryWriter

from trainer.config import TrainConfig
from trainer.flops import datasheet_peak, mfu
from trainer.loss import RECIPE_METRICS
from trainer.metrics import DeviceMetrics, psnr_from_mse
from trainer.runtime import Runtime
from trainer.state import TrainState

if TYPE_CHECKING:
    from trainer.checkpointing import CheckpointManager
    from trainer.learner import Learner


class StepReporter:
    def __init__(self, rt: Runtime, cfg: TrainConfig):
        self.rt = rt
        self.cfg = cfg
        self.metrics = DeviceMetrics(rt.device)
        self.tb: SummaryWriter | None = None  # rank 0's, opened when training starts
        self.data_wait_s = 0.0  # since the last log step: seconds blocked on the loader
        self.last: dict[str, Any] = {}
        # MFU needs the GPU's datasheet peak: none on CPU, or on a GPU with no datasheet figure
        self.peak_tflops: float | None = None
        if rt.device_kind == "cuda":
            self.peak_tflops, _why = datasheet_peak(torch.cuda.get_device_name(rt.device))

    def open(self) -> SummaryWriter | None:
        if self.rt.is_main:
            self.tb = SummaryWriter(str(self.rt.run_dir / "tensorboard"))
        return self.tb

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()

    def start(self, state: TrainState, learner: Learner, ckpts: CheckpointManager, cached: bool) -> None:
        """The start event and first heartbeat of this rank, and rank 0's word on the resume."""
        rt, cfg = self.rt, self.cfg
        # where the teacher's latents come from (a cached run shows it never loaded the teacher) and,
        # with the adversarial term, the discriminator it starts from (its digest equals the
        # checkpoint's after a resume)
        recipe: dict[str, Any] = {
            "teacher": "cache" if cached else ("online" if learner.teacher is not None else None),
            "teacher_loaded": learner.teacher is not None,
        }
        if learner.adversary is not None:
            recipe["discriminator_digest"] = learner.adversary.digest()
            recipe["discriminator_steps"] = learner.adversary.optimizer_steps()
        rt.events.emit(
            "start",
            world_size=rt.world,
            node=socket.gethostname(),
            local_rank=rt.local_rank,
            preset=cfg.run.preset,
            resumed_from=str(ckpts.resume_from.path) if ckpts.resume_from else None,
            max_steps=cfg.optim.max_steps,
            step=state.step,
            zero_stage=learner.zero_stage,
            precision=rt.precision,
            nonfinite_guard=learner.nonfinite_guard,
            skipped_checkpoints=[f"{s.path.name}: {'; '.join(s.problems)}" for s in ckpts.skipped],
            abandoned=str(ckpts.abandoned) if ckpts.abandoned else None,
            startup=rt.startup,
            **recipe,
        )
        rt.events.heartbeat(state.step)
        for s in ckpts.skipped:
            rt.log.info(f"not resuming from {s.path}: {s.state}: {'; '.join(s.problems)}")
        if ckpts.resume_from:
            rt.log.info(f"resumed from {ckpts.resume_from.path} at step {state.step}")

    def step(
        self,
        state: TrainState,
        grad_norm: float | torch.Tensor | None,
        step_time: float,
        data_wait_s: float,
        lr: float,
        stop: bool,
    ) -> None:
        """After each optimizer step: the heartbeat, and at log steps the reduced metrics."""
        self.metrics.add_step(grad_norm, step_time)
        self.data_wait_s += data_wait_s
        self.rt.events.heartbeat(
            state.step,
            now=False,
            step_time_s=step_time,
            wait_s=round(self.rt.collectives.wait_s, 6),
            data_wait_s=round(data_wait_s, 6),
        )
        log_every, max_steps = self.cfg.schedule.log_every, self.cfg.optim.max_steps
        if state.step % log_every == 0 or state.step in (1, max_steps) or stop:
            self._log(state, lr)

    def _log(self, state: TrainState, lr: float) -> None:
        """Means since the last log, reduced over ranks: the one place metrics leave the device
        (collective; every rank calls it at the same steps)."""
        rt = self.rt
        t0 = time.time()
        data_wait_s = self.data_wait_s / max(1, self.metrics.steps)
        self.data_wait_s = 0.0
        means, grad_norm, step_time = self.metrics.reduce(rt.world)
        rt.collectives.wait_s += time.time() - t0
        gpu_mem = torch.cuda.max_memory_allocated() / 2**30 if rt.device_kind == "cuda" else None
        self.last = {
            "step": state.step,
            "loss": means["loss"],
            "recon_loss": means["recon_loss"],
            "psnr": psnr_from_mse(means["recon_loss"]),
            "lr": lr,
            "grad_norm": grad_norm,
            "samples_per_s": self.cfg.effective_batch / step_time if step_time > 0 else 0.0,
            "step_time_s": step_time,
            "gpu_mem_gb": gpu_mem,
            "nonfinite_skipped": state.nonfinite_skipped,
            **{k: v for k, v in means.items() if k not in ("loss", "recon_loss")},
            # this rank's own wait for its loader (not reduced: a slow node's loader shows on its ranks)
            "data_wait_s": data_wait_s,
            "data_wait_share": data_wait_s / step_time if step_time > 0 else 0.0,
        }
        if self.peak_tflops and step_time > 0:
            d, loss = self.cfg.data, self.cfg.loss
            self.last["mfu"] = mfu(
                self.last["samples_per_s"],
                d.frames,
                d.height,
                d.width,
                self.cfg.topology.world_size,
                self.peak_tflops,
                teacher_decode=loss.distilling and loss.decoder_on_teacher_latents,
                model=self.cfg.model,
            )
        rt.events.emit("step", **self.last)
        if self.tb is not None:
            for k in (
                "loss",
                "recon_loss",
                "psnr",
                "lr",
                "samples_per_s",
                "mfu",
                "step_time_s",
                *RECIPE_METRICS,
            ):
                if k in self.last:
                    self.tb.add_scalar(f"train/{k}", self.last[k], state.step)
            if grad_norm is not None:
                self.tb.add_scalar("train/grad_norm", grad_norm, state.step)
        rt.log.info(
            f"step {state.step}/{self.cfg.optim.max_steps} loss {self.last['loss']:.5f} "
            f"psnr {self.last['psnr']:.2f} lr {lr:.3g} {self.last['samples_per_s']:.2f} clips/s"
            + (f" MFU {100 * self.last['mfu']:.1f} %" if "mfu" in self.last else "")
        )
