"""TAEHV training with accelerate + DeepSpeed (ZeRO-2/3): what `taehv-train --run RUN` runs on every rank.

Reads RUN/run.toml, writes events, heartbeats, TensorBoard scalars, samples and checkpoints into RUN
by docs/design.md's contracts. Every decision several ranks must share (skip a non-finite step, stop
on a signal, checkpoint outcome) is agreed by a collective, never taken by one rank alone.

The pieces, each in its own module: the rank's runtime (process group, device, logger, stop flag,
collectives: trainer.runtime), what trains (engine, EMA, discriminator, teacher: trainer.learner),
checkpoints (trainer.checkpointing), data (trainer.batches), the loss (trainer.loss), validation and
samples (trainer.validator), metrics out (trainer.reporting), and the progress a checkpoint carries
(trainer.state). This module holds the loop and the entry.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from trainer import checkpoint as ckpt
from trainer.batches import Batches
from trainer.checkpointing import CheckpointManager
from trainer.config import ConfigError, TrainConfig, load_config
from trainer.data import DataSourceError, find_videos
from trainer.latent_cache import CacheError, open_cache
from trainer.learner import build_learner
from trainer.log import RankLogger
from trainer.loss import RecipeLoss
from trainer.reporting import StepReporter
from trainer.runtime import Runtime, SetupError
from trainer.state import TrainState, lr_at
from trainer.teacher import TeacherError, load_teacher, probe_teacher
from trainer.validator import Validator

__all__ = ["EXIT_CONFIG", "EXIT_FAILED", "EXIT_OK", "Trainer", "lr_at", "run"]

EXIT_OK = 0
EXIT_CONFIG = 2  # bad config, data or checkpoint: nothing to retry
EXIT_FAILED = 1


def nonfinite_hint(compiled: bool, step: int, started_at: int) -> str:
    """What the give-up on non-finite losses adds: in a compiled run that has not trained a step
    since it began, the compiler is the first suspect (Inductor's CPU code once gave NaN where the
    same weights and clips ran finite eager)."""
    if not compiled or step != started_at:
        return ""
    return (
        f" (model.compile is on and this attempt has trained no step since step {started_at}: "
        "--set model.compile=false tells the compiler from the data)"
    )


class Trainer:
    """One rank's training, built whole in __init__ (a resume loaded), run by `train`."""

    def __init__(
        self,
        rt: Runtime,
        cfg: TrainConfig,
        state: TrainState,
        resume: str | None = None,
        weights_only: bool = False,
        teacher: torch.nn.Module | None = None,
        latent_cache: dict[str, Any] | None = None,
    ):
        self.rt = rt
        self.cfg = cfg
        self.state = state
        self.ckpts = CheckpointManager(rt, cfg)
        self.ckpts.resolve(resume, weights_only)
        self.learner = build_learner(
            rt, cfg, self.ckpts.resume_from, self.ckpts.universal, weights_only, teacher
        )
        if self.ckpts.resume_from:
            self.ckpts.load(state, self.learner, weights_only)
        # DeepSpeed's count comes back with its checkpoint, and nonfinite_skipped with ours: only
        # skips from here on are new
        self.ds_skipped_seen: int = self.learner.engine.skipped_steps
        if self.learner.adversary is not None:
            self.learner.adversary.broadcast_from_rank0()
        self.cached = latent_cache is not None
        self.batches = Batches(rt, cfg, state, latent_cache, self.ckpts.rescale_data_from)
        self.loss = RecipeLoss(cfg, self.learner)
        rt.mark("engine")  # the model built, DeepSpeed's engine made, a resume loaded
        self.validator = Validator(rt, cfg, self.learner, self.batches)
        self.reporter = StepReporter(rt, cfg)
        state.last_saved_step = state.step if self.ckpts.resume_from else -1
        self.started_at = state.step  # where this attempt began

    def train(self) -> int:
        cfg, state, rt = self.cfg, self.state, self.rt
        self.validator.tb = self.reporter.open()
        self.reporter.start(state, self.learner, self.ckpts, self.cached)
        stop_reason = "done"
        if cfg.schedule.val_at_start and state.step == 0:
            self.validate()
        first_step = True
        while state.step < cfg.optim.max_steps:
            t0 = time.perf_counter()
            stop_agreed = self.train_step()
            if first_step:
                first_step = False
                self.compiled(time.perf_counter() - t0)
            if stop_agreed:
                stop_reason = "signal"
                break
            if state.step % cfg.schedule.val_every == 0:
                self.validate()
            if state.step % cfg.schedule.checkpoint_every == 0:
                self.ckpts.save("interval", state, self.learner)
        if stop_reason == "done" and (state.last_val is None or state.last_val["step"] != state.step):
            self.validate()
        if state.last_saved_step != state.step:
            self.ckpts.save("stop" if stop_reason == "signal" else "final", state, self.learner)
        if stop_reason == "done":
            self.ckpts.export("final", {"step": state.step, "last_val": state.last_val}, self.learner)
        rt.events.emit(
            "stop", step=state.step, reason=stop_reason, exit_status=0, signal=rt.stop.signal_name or None
        )
        rt.events.heartbeat(state.step, stopped=True)
        self.reporter.close()
        rt.leave(self.learner.engine)
        return EXIT_OK

    def validate(self) -> dict[str, Any]:
        """Validate, and export best/ when the chosen PSNR beats the best so far (collective). With
        EMA on, the EMA weights are what a user takes away, so they choose best/; the untrained model
        (a validation at step 0) is a baseline, never the best weights."""
        result = self.validator(self.state)
        if self.learner.compile_cache is not None:
            self.learner.compile_cache.save_new()  # the first validation compiles its no-grad graphs
        if not result:
            return result
        chosen_by = "ema_psnr" if "ema_psnr" in result else "psnr"
        if self.state.step > 0 and result[chosen_by] > self.state.best_psnr:
            self.state.best_psnr = result[chosen_by]
            self.ckpts.export("best", {**result, "chosen_by": chosen_by}, self.learner)
        return result

    def compiled(self, first_step_s: float) -> None:
        """After this attempt's first step, in a compiled run: rank 0 saves what it compiled into the
        run's compile cache, and every rank tells how long the step took and what came from the cache
        (the `compile` event)."""
        cache = self.learner.compile_cache
        if cache is None:
            return
        cache.save_new()
        summary = cache.summary()
        self.rt.events.emit(
            "compile", step=self.state.step, first_step_s=round(first_step_s, 3), cache=summary
        )
        self.rt.log.info(
            f"first step {first_step_s:.1f} s, compiling: {summary['hits']} graphs from the compile cache "
            f"({summary['loaded']} artifacts loaded from the run's), {summary['misses']} compiled"
        )

    def train_step(self) -> bool:
        """One optimizer step (grad_accum micro-batches). Returns True when all ranks agreed to stop."""
        cfg, state, rt, learner = self.cfg, self.state, self.rt, self.learner
        engine = learner.engine
        t0 = time.time()
        rt.collectives.wait_s = 0.0
        data_wait_s = 0.0  # this rank blocked on its loader: the share says whether workers keep up
        lr = lr_at(state.step, cfg)
        for group in learner.optimizer.param_groups:
            group["lr"] = lr
        done, tries = 0, 0
        stop_agreed = False
        on_device = learner.nonfinite_guard == "deepspeed-step"
        while done < cfg.optim.grad_accum:
            tries += 1
            if tries > 10 * cfg.optim.grad_accum:
                raise RuntimeError(
                    f"{tries - 1} micro-batches in a row had a non-finite loss on some rank; giving up"
                    + nonfinite_hint(cfg.model.compile, state.step, self.started_at)
                )
            waited = time.perf_counter()
            batch = self.batches.next()
            data_wait_s += time.perf_counter() - waited
            rt.faults.sleep("delay", state.step)
            rt.faults.maybe_raise(state.step)
            # cached-latent batches carry no jitter: their targets were encoded from unjittered frames
            jitter = batch.get("jitter") if cfg.data.color_jitter > 0 else None
            x = self.batches.to_input(batch["video"], jitter)
            t_lat = batch.get("latents")
            loss, parts = self.loss(x, None if t_lat is None else t_lat.to(rt.device, non_blocking=True))
            if rt.faults.nan_loss(state.step):
                loss = loss * float("nan")
            rt.faults.sleep("stall", state.step)
            if on_device:
                # nothing read back to the host: the loss stays on the device until the log interval
                finite = torch.isfinite(loss)
                engine.backward(loss)
                engine.step()
                done += 1
                values = {"loss": loss, **parts}
                self.reporter.metrics.add_micro_batch(
                    {k: torch.where(finite, v.detach().float(), 0.0) for k, v in values.items()}
                )
                continue
            # One small collective per micro-batch: any rank's non-finite loss skips it everywhere,
            # any rank's stop request stops everywhere at the end of this step.
            bad, stop = rt.collectives.all_reduce(
                [0.0 if torch.isfinite(loss).item() else 1.0, 1.0 if rt.stop.requested else 0.0], op="max"
            )
            stop_agreed = stop_agreed or stop > 0
            if bad > 0:
                state.nonfinite_skipped += 1
                del loss, parts
                if learner.zero_stage == 3:
                    # a forward with no backward leaves gathered/prefetched ZeRO-3 params in flight
                    engine.empty_partition_cache()
                rt.log.warning(
                    f"step {state.step}: non-finite loss on some rank; micro-batch skipped "
                    f"on all ranks ({state.nonfinite_skipped} so far)"
                )
                continue
            engine.backward(loss)
            engine.step()
            if learner.adversary is not None:
                assert self.loss.adv_inputs is not None  # the loss set them for this micro-batch
                parts["adv_d_loss"] = learner.adversary.discriminator_step(*self.loss.adv_inputs)
                self.loss.adv_inputs = None
            done += 1
            self.reporter.metrics.add_micro_batch({"loss": loss.detach(), **parts})
        if on_device:
            # one small collective per optimizer step, in the background: any rank's stop request
            # stops every rank at the next step
            stop_agreed = rt.collectives.stop_agreed(rt.stop.requested)
            skipped = engine.skipped_steps - self.ds_skipped_seen
            self.ds_skipped_seen = engine.skipped_steps
            if skipped:
                state.nonfinite_skipped += skipped
                rt.log.warning(
                    f"step {state.step + 1}: non-finite gradients on some rank; DeepSpeed "
                    f"skipped the update ({state.nonfinite_skipped} so far)"
                )
        if learner.ema is not None:
            learner.ema.update()
        state.step += 1
        step_time = time.time() - t0
        self.reporter.step(state, engine.get_global_grad_norm(), step_time, data_wait_s, lr, stop_agreed)
        return stop_agreed


def run(run_dir: str | Path, resume: str | None = None, weights_only: bool = False) -> int:
    """Entry for one rank. Config and data problems are reported before any process group starts."""
    imported_at = time.time()
    run_dir = Path(run_dir)
    log = RankLogger(int(os.environ.get("RANK", "0")))
    try:
        cfg = load_config(run_dir / "run.toml")
        # fail fast, before any collective: every rank checks its own view of the data
        find_videos(cfg.data.source, cfg.data.root)
        teacher, cache = _recipe_inputs(cfg)
    except (ConfigError, DataSourceError, TeacherError, CacheError) as err:
        log.error(f"error: {err}")
        return EXIT_CONFIG
    rt: Runtime | None = None
    state = TrainState()
    try:
        rt = Runtime.start(run_dir, cfg, imported_at)
        return Trainer(rt, cfg, state, resume, weights_only, teacher=teacher, latent_cache=cache).train()
    except (ckpt.CheckpointError, DataSourceError, SetupError) as err:
        _report_error(rt, log, state, err)
        return EXIT_CONFIG
    except Exception as err:  # noqa: BLE001 - report, then fail the rank so the launcher sees it
        _report_error(rt, log, state, err)
        return EXIT_FAILED
    finally:
        _remove_dump_pipe()


def _remove_dump_pipe() -> None:
    """ProcessGroupNCCL makes `<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe` (the FIFO the console
    triggers Flight Recorder dumps through, in the node's /tmp) and never removes it (torch 2.13's
    ~DumpPipe only closes it): without this every NCCL run left a FIFO per rank on every node."""
    stem = os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    if stem:
        try:
            Path(f"{stem}{os.environ.get('RANK', '0')}.pipe").unlink()
        except OSError:
            pass


def _recipe_inputs(cfg: TrainConfig) -> tuple[torch.nn.Module | None, dict[str, Any] | None]:
    """(teacher on the CPU, None) for online distillation, (None, cache manifest) for cached latents,
    (None, None) without a teacher. Raises TeacherError/CacheError: a distilling run never falls back
    to reconstruction-only."""
    if cfg.loss.teacher_cache:
        return None, open_cache(cfg.loss.teacher_cache, cfg)
    if not cfg.loss.teacher:
        return None, None
    rule, family = cfg.clip_rule, cfg.model.family
    teacher = load_teacher(
        cfg.loss.teacher,
        cfg.loss.teacher_subfolder,
        cfg.model.latent_channels,
        family=family,
        space_scale=rule.space_scale,
        time_scale=rule.time_scale,
    )
    probe = probe_teacher(teacher, cfg.model.latent_channels, family, rule.time_scale, rule.space_scale)
    if not probe.ok:
        raise TeacherError(
            f"loss.teacher = {cfg.loss.teacher!r}: latents of shape {probe.latent_shape} for a "
            f"test clip, the {family} student needs {probe.expected} (latents x C x h x w)"
        )
    return teacher, None


def _report_error(rt: Runtime | None, log: RankLogger, state: TrainState, err: BaseException) -> None:
    tb = traceback.format_exc()
    (rt.log if rt is not None else log).error(f"error: {err}\n{tb}")
    if rt is not None:
        rt.events.emit("error", message=str(err), traceback="".join(tb.splitlines(True)[-12:]))
        rt.events.emit("stop", step=state.step, reason="error", exit_status=1)
