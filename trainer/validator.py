"""Validation: PSNR and SSIM of the model (and of its EMA) on the validation clips, reduced over
ranks, and the reconstruction samples of a fixed set of those clips (RUN/samples/step-<N>/, and
TensorBoard's val/samples), made from validation's own outputs: no extra forward pass."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainer.batches import Batches
from trainer.config import TrainConfig
from trainer.data import validation_items
from trainer.metrics import psnr_from_mse, ssim_per_frame
from trainer.model import TAEHV, build_model, reconstruction_target
from trainer.runtime import Runtime
from trainer.samples import SampleClip, write_step_samples
from trainer.state import TrainState

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from trainer.learner import Learner

SAMPLE_CLIPS = 4  # rank 0's first validation clips: the same ones at every validation of a run


class Validator:
    def __init__(self, rt: Runtime, cfg: TrainConfig, learner: Learner, batches: Batches):
        self.rt = rt
        self.cfg = cfg
        self.learner = learner
        self.batches = batches
        self.tb: SummaryWriter | None = None  # rank 0's, set when training starts
        self._ema_model: TAEHV | None = None  # a plain copy of the model that validates the EMA weights

    def __call__(self, state: TrainState) -> dict[str, Any]:
        """Validate at state.step (collective); {} without validation clips."""
        val_set, learner = self.batches.val_set, self.learner
        if val_set is None:
            return {}
        learner.engine.eval()
        sums = [0.0, 0.0, 0.0, 0.0, 0.0]  # psnr, ssim, clips; EMA psnr, ssim
        ema_model = self._ema_validation_model() if learner.ema is not None else None
        samples: list[SampleClip] = []
        # the samples show the weights a user takes away: the EMA's when there is one
        shown = ema_model if ema_model is not None else learner.engine
        with torch.no_grad():
            # every rank runs the same number of forward passes (ZeRO-3 gathers in each)
            for index, seed, counts in validation_items(len(val_set), self.rt.rank, self.rt.world):
                item = val_set[(index, seed)]
                self.batches.report_skips(item["skipped"])
                x = self.batches.to_input(item["video"][None])
                for model, at in ((learner.engine, 0), (ema_model, 3)):
                    if model is None:
                        continue
                    _z, y = model(x)  # a filler item (counts False) runs too: ZeRO-3 gathers in it
                    if not counts:
                        continue
                    target = reconstruction_target(x, y.shape[1])
                    psnr = psnr_from_mse(torch.mean((y.float() - target.float()) ** 2).item())
                    sums[at] += psnr
                    sums[at + 1] += ssim_per_frame(y.float(), target.float()).mean().item()
                    if self.rt.is_main and model is shown and len(samples) < SAMPLE_CLIPS:
                        source = str(val_set.paths[item["index"]])
                        samples.append(
                            SampleClip(len(samples), source, target[0].cpu(), y[0].float().cpu(), psnr)
                        )
                sums[2] += 1 if counts else 0
        learner.engine.train()
        psnr_sum, ssim_sum, n, ema_psnr_sum, ema_ssim_sum = self.rt.collectives.all_reduce(sums)
        if n == 0:
            return {}
        result: dict[str, Any] = {
            "step": state.step,
            "psnr": psnr_sum / n,
            "ssim": ssim_sum / n,
            "n_clips": int(n),
        }
        if ema_model is not None:
            result.update(ema_psnr=ema_psnr_sum / n, ema_ssim=ema_ssim_sum / n)
        state.last_val = result
        if self.rt.is_main:
            self._report(result, samples)
        return result

    def _report(self, result: dict[str, Any], samples: list[SampleClip]) -> None:
        """Rank 0: the val event, TensorBoard, the log line, and the samples."""
        assert self.tb is not None  # rank 0 writes TensorBoard
        step = int(result["step"])
        extra: dict[str, Any] = {}
        if samples:
            where, strips = write_step_samples(self.rt.run_dir, step, samples)
            extra["samples"] = str(where)
            for clip, image in zip(samples, strips, strict=True):
                self.tb.add_image(f"val/samples/clip-{clip.index}", image, step, dataformats="HWC")
        self.rt.events.emit("val", **result, **extra)
        for key in ("psnr", "ssim", "ema_psnr", "ema_ssim"):
            if key in result:
                self.tb.add_scalar(f"val/{key}", result[key], step)
        ema_text = f"; EMA PSNR {result['ema_psnr']:.2f} dB" if "ema_psnr" in result else ""
        self.rt.log.info(f"val step {step}: PSNR {result['psnr']:.2f} dB SSIM {result['ssim']:.4f}{ema_text}")

    def _ema_validation_model(self) -> TAEHV:
        """A plain (non-DeepSpeed) model on this device holding the whole EMA weights: every rank
        validates the EMA without disturbing the engine's (possibly partitioned) parameters."""
        assert self.learner.ema is not None  # asked for only with EMA on
        weights = self.learner.ema.full_weights()  # collective
        if self._ema_model is None:
            model = build_model(self.cfg.model.model_copy(update={"init_weights": ""}))
            self._ema_model = model.to(self.rt.device, self.rt.model_dtype).eval()
        self._ema_model.load_state_dict(weights)
        return self._ema_model
