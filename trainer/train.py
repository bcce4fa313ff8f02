"""TAEHV training with accelerate + DeepSpeed (ZeRO-2/3): what `taehv-train --run RUN` runs on every rank.

Reads RUN/run.toml, writes events, heartbeats, TensorBoard scalars and checkpoints into RUN by
docs/design.md's contracts. Every decision several ranks must share (skip a non-finite step, stop on
a signal, checkpoint outcome) is agreed by a collective, never taken by one rank alone.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer import checkpoint as ckpt
from trainer.config import TrainConfig, load_config
from trainer.data import (
    DataSourceError,
    VideoClipDataset,
    find_videos,
    make_train_loader,
    split_train_val,
    validation_items,
)
from trainer.ds_config import deepspeed_skips_nonfinite_step
from trainer.events import CollectiveWatch, EventWriter, atomic_write_text
from trainer.faults import FaultPlan
from trainer.master_weights import MasterEMA, full_fp32_weights
from trainer.metrics import DeviceMetrics

if TYPE_CHECKING:
    import torch

    from trainer.latent_cache import CachedLatentDataset

EXIT_OK = 0
# the recipe's losses (step events carry them by name; TensorBoard gets them as train/<name>)
RECIPE_METRICS = ("distill_loss", "decoder_teacher_loss", "adv_g_loss", "adv_d_loss")
EXIT_CONFIG = 2  # bad config, data or checkpoint: nothing to retry
EXIT_FAILED = 1


class SetupError(RuntimeError):
    """The run cannot start as configured (device, teacher, world size); the message says why."""


def lr_at(step: int, cfg: TrainConfig) -> float:
    """LR for optimizer step `step` (0-based): linear warmup, then the schedule. A function of the
    optimizer step only, so it is the same for any number of processes and across resume."""
    o = cfg.optim
    if o.warmup_steps and step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    if o.schedule == "constant":
        return o.lr
    span = max(1, o.max_steps - o.warmup_steps)
    progress = min(1.0, (step - o.warmup_steps) / span)
    floor = o.lr * o.min_lr_ratio
    if o.schedule == "linear":
        return floor + (o.lr - floor) * (1 - progress)
    return floor + (o.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


class StopRequest:
    """SIGTERM/SIGINT only set a flag; the loop finishes the step and all ranks agree to stop."""

    def __init__(self):
        self.requested = False
        self.signal_name = ""

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handler)

    def _handler(self, signum, _frame) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name


def _set_single_process_env() -> None:
    # A run started without a launcher still gets a (1-process) process group, so one code path
    # serves 1 and N processes.
    if "WORLD_SIZE" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


class Trainer:
    train_set: VideoClipDataset | CachedLatentDataset

    def __init__(
        self,
        run_dir: Path,
        cfg: TrainConfig,
        resume: str | None,
        weights_only: bool,
        teacher=None,
        latent_cache: dict | None = None,
    ):
        self.run_dir = run_dir
        self.cfg = cfg
        # checked before any process group: a loaded teacher (CPU) or a cache manifest that matches the data
        self.teacher_cpu = teacher
        self.latent_cache = latent_cache
        self.resume_spec = resume
        self.weights_only = weights_only
        self.stop = StopRequest()
        self.collective_wait_s = 0.0  # per step: seconds spent in _all_reduce (see there)
        self.data_wait_log_s = 0.0  # since the last logged step: seconds blocked on the loader
        self.abandoned: Path | None = None  # where a resume --from moved the newer checkpoints
        self.universal = False  # resuming from step-<N>/universal at another world size
        self.rescale_data_from: tuple[int, int] | None = None  # (samples per rank, world) of the source

    # ---------------------------------------------------------------- setup
    def setup(self) -> None:
        import torch

        cfg = self.cfg
        self.device_kind = cfg.topology.device
        if self.device_kind == "cuda" and not torch.cuda.is_available():
            raise SetupError(
                f"{self.run_dir}/run.toml: topology.device is cuda but no CUDA device is visible"
            )
        os.environ.setdefault("DS_ACCELERATOR", "cpu" if self.device_kind == "cpu" else "cuda")
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        _set_single_process_env()
        if self.device_kind == "cuda":
            # clip shapes are fixed for a run, so cuDNN's per-shape algorithm search pays off
            torch.backends.cudnn.benchmark = True
        if self.device_kind == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
        for k, v in cfg.distributed.nccl_env.items():
            os.environ.setdefault(k, v)

        from accelerate import Accelerator, PartialState
        from accelerate.utils import DeepSpeedPlugin

        from trainer.ds_config import build_deepspeed_config, resolve_precision

        # The process group is created here, with the configured timeout: DeepSpeed and accelerate
        # reuse it, so collective_timeout_s really is what a hung collective waits for.
        backend = "gloo" if self.device_kind == "cpu" else "nccl"
        self.state = PartialState(
            backend=backend, timeout=timedelta(seconds=cfg.distributed.collective_timeout_s)
        )
        self.ds_config = build_deepspeed_config(cfg, self.device_kind)
        self.precision = resolve_precision(cfg, self.device_kind)
        plugin = DeepSpeedPlugin(hf_ds_config=self.ds_config)
        self.accelerator = Accelerator(deepspeed_plugin=plugin)
        self.rank = self.accelerator.process_index
        self.world = self.accelerator.num_processes
        self.local_rank = self.accelerator.local_process_index
        self.is_main = self.rank == 0
        self.device = self.accelerator.device
        if self.world != cfg.topology.world_size:
            raise SetupError(
                f"run.toml says {cfg.topology.nodes} node(s) × {cfg.topology.gpus_per_node} = "
                f"{cfg.topology.world_size} processes, but the launcher started {self.world}"
            )
        self.faults = FaultPlan(self.rank)
        self.events = EventWriter(self.run_dir, self.rank)
        self.collective_watch = CollectiveWatch(self.events)
        self.ckpt_root = self.run_dir / "checkpoints"
        if self.is_main:
            self.ckpt_root.mkdir(parents=True, exist_ok=True)
        self.stop.install()

    def build(self) -> None:
        import torch

        from trainer.model import build_model

        cfg = self.cfg
        torch.manual_seed(cfg.run.seed)
        model = build_model(cfg.model)
        self.resume_from: ckpt.CheckpointStatus | None = None
        self.skipped_checkpoints: list[ckpt.CheckpointStatus] = []
        if self.resume_spec:
            self.resume_from, self.skipped_checkpoints = ckpt.resolve_resume(self.ckpt_root, self.resume_spec)
            if self.resume_from and self.resume_from.world_size != self.world and not self.weights_only:
                problem = ckpt.universal_problem(self.resume_from.path)
                if problem:
                    import shlex

                    raise ckpt.CheckpointError(
                        f"{self.resume_from.path} was written by {self.resume_from.world_size} processes, this run "
                        f"has {self.world}: its ZeRO optimizer shards load only at that world size ({problem}). "
                        "Either convert it once to DeepSpeed's universal checkpoint, which loads at any world size: "
                        f"{shlex.join(ckpt.universal_command(self.resume_from.path))} and resume again, or resume "
                        "weights-only with a fresh optimizer (taehv-train --resume ... --weights-only)."
                    )
                self.universal = True
            if self.resume_from and self.resume_spec != "latest":
                self._start_timeline(self.resume_from)
            if self.resume_from and self.weights_only:
                from safetensors.torch import load_file

                model.load_state_dict(load_file(str(self.resume_from.path / ckpt.WEIGHTS)))
        from deepspeed.checkpoint.constants import (
            UNIVERSAL_CHECKPOINT_INFO,
            UNIVERSAL_CHECKPOINT_VERSION_KEY,
            UNIVERSAL_CHECKPOINT_VERSION_VALUE,
        )

        # saved into every checkpoint: what ds_to_universal needs to convert it for another world size
        setattr(
            model,
            UNIVERSAL_CHECKPOINT_INFO,
            {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE},
        )
        if self.universal:
            # DeepSpeed reads this when load_checkpoint runs; accelerate keeps its own copy of the config
            self.accelerator.state.deepspeed_plugin.deepspeed_config["checkpoint"] = {"load_universal": True}
        if cfg.model.compile:
            model.compile()
        self.teacher = self._teacher_on_device()
        decay: list[torch.nn.Parameter] = []
        no_decay: list[torch.nn.Parameter] = []
        for name, p in model.named_parameters():
            (no_decay if p.ndim <= 1 else decay).append(p)
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": cfg.optim.weight_decay},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=lr_at(0, cfg),
            betas=cfg.optim.betas,
            eps=cfg.optim.eps,
        )
        self.engine, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.zero_stage = self.ds_config["zero_optimization"]["stage"]
        if self.is_main:
            # what DeepSpeed really runs with, beside what was asked: a knob that never reached it shows here
            from trainer.ds_config import effective_deepspeed_config

            atomic_write_text(
                self.run_dir / "deepspeed.effective.json", _json(**effective_deepspeed_config(self.engine))
            )
        self.model_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision, torch.float32)

        # Trainer state that checkpoints carry besides DeepSpeed's.
        self.step = 0
        self.samples_consumed = 0
        self.nonfinite_skipped = 0
        self.data_skipped = 0
        self.best_psnr = -math.inf
        self.last_val: dict | None = None
        self.ema = MasterEMA(self.engine, cfg.optim.ema_decay) if cfg.optim.ema_decay > 0 else None
        self.metrics = DeviceMetrics(self.device)
        self._ema_model = None  # a plain copy of the model that validates the EMA weights
        self.adversary = None
        if cfg.adversarial.weight > 0:
            from trainer.discriminator import Adversary

            self.adversary = Adversary(cfg.adversarial, cfg.model.latent_channels, self.device, cfg.run.seed)
        # Who keeps a non-finite loss out of the weights. DeepSpeed's ZeRO optimizers under bf16 or
        # fp16 check the gradients at the optimizer step and skip the whole step
        # (engine.skipped_steps), so the trainer need not look at the loss on the host between
        # forward and backward: no host synchronisation per micro-batch. Elsewhere (fp32, where
        # DeepSpeed checks nothing; a ZeRO-3 that checks only fp16; the discriminator, which
        # DeepSpeed does not step) the trainer checks each micro-batch's loss and skips it on every
        # rank.
        self.nonfinite_guard = (
            "deepspeed-step"
            if self.adversary is None and deepspeed_skips_nonfinite_step(self.zero_stage, self.precision)
            else "micro-batch"
        )
        if self.resume_from:
            self._load_checkpoint(self.resume_from)
        # DeepSpeed's count comes back with its checkpoint, and nonfinite_skipped with ours: only
        # skips from here on are new
        self._ds_skipped_seen = self.engine.skipped_steps
        if self.adversary is not None:
            self.adversary.broadcast_from_rank0()

    def _start_timeline(self, source: ckpt.CheckpointStatus) -> None:
        """Resuming from a chosen checkpoint makes its line of history the current one: newer
        checkpoints move aside (kept) and `latest` names the source, so neither a later
        `resume latest` nor retention acts on the abandoned line."""
        self._barrier()  # every rank has verified the source before anything moves
        if self.is_main:
            self.abandoned = ckpt.abandon_newer(self.ckpt_root, source.step)
            if source.path.parent.resolve() == self.ckpt_root.resolve():
                ckpt.write_latest(self.ckpt_root, source.path.name)
            if self.abandoned:
                print(
                    f"[taehv-train] resuming from {source.path.name}: the newer checkpoints of the old timeline "
                    f"were moved to {self.abandoned} (kept, never resumed from automatically)",
                    flush=True,
                )
        self._barrier()

    def _teacher_on_device(self):
        """The teacher run() loaded and checked, moved to this rank's device; None when the run does
        not distil or reads cached latents (then no teacher is ever loaded)."""
        import torch

        if self.teacher_cpu is None:
            return None
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        teacher, self.teacher_cpu = self.teacher_cpu.to(self.device, dtype), None
        return teacher

    @property
    def parts(self) -> tuple[str, ...]:
        """Optional parts this run's checkpoints carry (trainer.checkpoint.PART_FILES)."""
        return ("discriminator",) if self.adversary is not None else ()

    # ---------------------------------------------------------------- collectives
    def _all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        import torch
        import torch.distributed as dist

        dev = self.device if self.device_kind == "cuda" else "cpu"
        t0 = time.time()
        t = torch.tensor(values, dtype=torch.float64, device=dev)
        self.collective_watch.enter("all_reduce")
        try:
            dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
            out = t.tolist()  # on CUDA the wait for the other ranks lands here, so it is inside the timing
        finally:
            self.collective_watch.leave()
        # Time blocked on the other ranks: every rank's step time is the same (collectives line them
        # up), so step time minus this wait is what tells a straggler from the ranks waiting for it.
        self.collective_wait_s += time.time() - t0
        return out

    def _barrier(self) -> None:
        import torch.distributed as dist

        self.collective_watch.enter("barrier")
        try:
            dist.barrier()
        finally:
            self.collective_watch.leave()

    def full_weights(self, use_ema: bool = False) -> dict[str, torch.Tensor] | None:
        """Full fp32 tensors from the optimizer's master weights (not the module's bf16 copies) on
        rank 0, None elsewhere. Collective: every rank must call it."""
        if use_ema:
            assert self.ema is not None  # callers ask for the EMA only when there is one
            sd = self.ema.full_weights()
        else:
            sd = full_fp32_weights(self.engine)
        return sd if self.is_main else None

    # ---------------------------------------------------------------- checkpoints
    def save_checkpoint(self, reason: str) -> bool:
        import torch
        import torch.distributed as dist
        from safetensors.torch import save_file

        step = self.step
        tmp = self.ckpt_root / f"step-{step}.tmp"
        t0 = time.time()
        if self.is_main:
            if tmp.exists():  # left by a save that died; never reused as it is
                import shutil

                shutil.rmtree(tmp)
            (tmp / "trainer").mkdir(parents=True)
            self.events.emit("checkpoint", step=step, path=str(tmp), status="started", reason=reason)
        self._barrier()
        with ckpt.disk_full_named(tmp):
            self.engine.save_checkpoint(
                str(tmp), tag=ckpt.DS_TAG, client_state={"step": step}, save_latest=False
            )
            weights = self.full_weights()
            ema_weights = self.full_weights(use_ema=True) if self.ema is not None else None
            torch.save(
                {
                    "torch_rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state() if self.device_kind == "cuda" else None,
                    "samples_consumed": self.samples_consumed,
                    "ema": self.ema.state() if self.ema is not None else None,
                },
                tmp / ckpt.rank_state_name(self.rank),
            )
            if self.is_main:
                assert weights is not None  # rank 0 holds them
                save_file(weights, str(tmp / ckpt.WEIGHTS))
                if ema_weights is not None:
                    save_file(ema_weights, str(tmp / "weights_ema.safetensors"))
                if self.adversary is not None:
                    self.adversary.save(tmp)  # every rank holds the same discriminator: rank 0's copy is it
                atomic_write_text(
                    tmp / "trainer" / "state.json",
                    _json(
                        step=step,
                        best_psnr=self.best_psnr if math.isfinite(self.best_psnr) else None,
                        nonfinite_skipped=self.nonfinite_skipped,
                        data_skipped=self.data_skipped,
                        world_size=self.world,
                        preset=self.cfg.run.preset,
                        last_val=self.last_val,
                    ),
                )
        self.faults.sleep("ckpt_sleep", step)
        self._barrier()
        ok, message, final = 1.0, "", None
        if self.is_main:
            try:
                final = ckpt.finalize(
                    tmp,
                    step,
                    self.world,
                    self.zero_stage,
                    {"preset": self.cfg.run.preset, "parts": list(self.parts)},
                    parts=self.parts,
                )
            except (ckpt.CheckpointError, OSError) as err:
                ok, message = 0.0, str(err)
        ok = self._all_reduce([ok])[0] if self.world > 1 else ok  # only rank 0 can say 1: sum == 1 means done
        ok = bool(ok)
        if self.is_main:
            if ok:
                # pruning only ever follows a complete save
                ckpt.prune(
                    self.ckpt_root,
                    self.cfg.schedule.keep_checkpoints,
                    step,
                    protect=(self.resume_from.path,) if self.resume_from else (),
                )
                assert final is not None  # ok: rank 0 finalized it
                nbytes = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
                self.events.emit(
                    "checkpoint",
                    step=step,
                    path=str(final),
                    seconds=round(time.time() - t0, 3),
                    bytes=nbytes,
                    status="complete",
                    reason=reason,
                )
            else:
                self.events.emit(
                    "checkpoint",
                    step=step,
                    path=str(tmp),
                    seconds=round(time.time() - t0, 3),
                    bytes=0,
                    status="failed",
                    reason=reason,
                    message=message,
                )
                print(
                    f"[taehv-train] checkpoint at step {step} FAILED: {message}", file=sys.stderr, flush=True
                )
        self.last_saved_step = step
        dist.barrier()
        return ok

    def _load_checkpoint(self, st: ckpt.CheckpointStatus) -> None:
        import json

        import torch

        if self.universal:
            self._load_universal(st)
        elif not self.weights_only:
            load_path, _ = self.engine.load_checkpoint(
                str(st.path), tag=ckpt.DS_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
            )
            if load_path is None:
                raise ckpt.CheckpointError(f"{st.path}: DeepSpeed found nothing to load")
            rank_state = torch.load(
                st.path / ckpt.rank_state_name(self.rank), map_location="cpu", weights_only=True
            )
            torch.set_rng_state(rank_state["torch_rng"])
            if self.device_kind == "cuda" and rank_state.get("cuda_rng") is not None:
                torch.cuda.set_rng_state(rank_state["cuda_rng"])
            self.samples_consumed = int(rank_state["samples_consumed"])
            if self.ema is not None and rank_state.get("ema") is not None:
                try:
                    self.ema.load(rank_state["ema"], str(st.path / ckpt.rank_state_name(self.rank)))
                except ValueError as err:
                    raise ckpt.CheckpointError(str(err)) from None
        if self.adversary is not None:
            from trainer.discriminator import WEIGHTS as DISC_WEIGHTS

            if (st.path / DISC_WEIGHTS).is_file():
                self.adversary.load(st.path)
            elif self.is_main:
                print(
                    f"[taehv-train] {st.path} has no discriminator: the adversarial term starts with a fresh one",
                    flush=True,
                )
        state = json.loads((st.path / "trainer" / "state.json").read_text())
        self.step = int(state["step"])
        self.best_psnr = state.get("best_psnr") or -math.inf
        self.nonfinite_skipped = int(state.get("nonfinite_skipped", 0))
        self.data_skipped = int(state.get("data_skipped", 0))
        self.last_val = state.get("last_val")
        if self.weights_only:
            # a fresh optimizer on another world size: the data position restarts for this world
            self.samples_consumed = (
                self.step
                * self.cfg.optim.grad_accum
                * self.cfg.optim.batch_per_gpu
                // self.cfg.data.crops_per_clip
            )  # items: a clip's crops are one

    def _load_universal(self, st: ckpt.CheckpointStatus) -> None:
        """Weights and optimizer state from step-<N>/universal at this world size. Step and LR come
        from state.json as usual; the data position is carried over in build_data; EMA restarts
        from the loaded weights (its shards follow the old partitioning)."""
        import torch

        load_path, _ = self.engine.load_checkpoint(
            str(st.path), tag=ckpt.UNIVERSAL, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if load_path is None:
            raise ckpt.CheckpointError(f"{st.path / ckpt.UNIVERSAL}: DeepSpeed found nothing to load")
        rank0 = torch.load(st.path / ckpt.rank_state_name(0), map_location="cpu", weights_only=True)
        assert st.world_size is not None  # a universal load is chosen for a known, different world size
        self.rescale_data_from = (int(rank0["samples_consumed"]), int(st.world_size))
        if self.ema is not None:
            self.ema = MasterEMA(self.engine, self.cfg.optim.ema_decay)  # from the loaded master weights
        if self.is_main:
            print(
                f"[taehv-train] loaded the universal checkpoint {st.path / ckpt.UNIVERSAL} "
                f"(written by {st.world_size} processes) at {self.world}",
                flush=True,
            )

    # ---------------------------------------------------------------- data
    def build_data(self) -> None:
        cfg = self.cfg
        videos = find_videos(cfg.data.source, cfg.data.root)
        self.train_paths, self.val_paths = split_train_val(
            videos, cfg.data.val_fraction, cfg.data.val_max_clips
        )
        if self.latent_cache is not None:
            self._build_cached_data()
            return
        self.train_set = VideoClipDataset(self.train_paths, cfg.data, train=True)
        self.val_set = VideoClipDataset(self.val_paths, cfg.data, train=False) if self.val_paths else None
        if self.rescale_data_from:
            consumed, old_world = self.rescale_data_from
            self.samples_consumed = ckpt.rescaled_data_position(
                consumed, old_world, self.world, len(self.train_set)
            )
        self.loader = make_train_loader(
            self.train_set,
            self.rank,
            self.world,
            cfg.run.seed,
            cfg.optim.batch_per_gpu,
            self.samples_consumed,
            cfg.data.num_workers,
            cfg.data.prefetch_factor,
        )
        self.batches = iter(self.loader)

    def _build_cached_data(self) -> None:
        """Training items from the teacher latent cache (run() checked it against the data);
        validation decodes its clips as usual, since it needs no teacher."""
        from trainer.latent_cache import CachedLatentDataset, make_cached_loader

        cfg = self.cfg
        assert self.latent_cache is not None  # run() chose this path for a cache it loaded
        train_set = CachedLatentDataset(cfg.loss.teacher_cache, self.latent_cache, self.train_paths, cfg.data)
        self.train_set = train_set
        if self.is_main and train_set.unusable:
            print(
                f"[taehv-train] latent cache: {len(train_set.unusable)} clip(s) have no cached window "
                f"(too short or too small) and are left out, e.g. {train_set.unusable[0]}",
                flush=True,
            )
        self.val_set = VideoClipDataset(self.val_paths, cfg.data, train=False) if self.val_paths else None
        self.loader = make_cached_loader(
            train_set,
            self.rank,
            self.world,
            cfg.run.seed,
            cfg.optim.batch_per_gpu,
            self.samples_consumed,
            cfg.data.num_workers,
            cfg.data.prefetch_factor,
        )
        self.batches = iter(self.loader)

    def _next_batch(self):
        batch = next(self.batches)
        self.samples_consumed += len(batch["index"])  # sampler items (data.crops_per_clip crops each)
        self._report_skips(batch["skipped"])
        return batch

    def _report_skips(self, skipped: list[dict]) -> None:
        for s in skipped:
            self.data_skipped += 1
            self.events.emit(
                "data", step=self.step, path=s["path"], reason=s["reason"], count=self.data_skipped
            )
            print(
                f"[taehv-train] rank {self.rank}: skipped {s['path']}: {s['reason']}",
                file=sys.stderr,
                flush=True,
            )

    def _to_input(self, video_u8, jitter=None):
        # uint8 crosses the loader and the bus; float conversion and colour jitter happen on the device
        from trainer.augment import to_model_input

        return to_model_input(video_u8.to(self.device, non_blocking=True), self.model_dtype, jitter)

    # ---------------------------------------------------------------- losses
    def _teacher_latents(self, x):
        from trainer.teacher import encode

        return encode(self.teacher, x, self.engine.module.t_upscale).to(x.dtype)

    def compute_loss(self, x, t_lat=None):
        """Total loss and its parts for one micro-batch x (N×T×3×H×W in [0, 1]); t_lat: the teacher's
        latents read from the cache (None: the online teacher encodes x, when the run distils)."""
        import torch.nn.functional as F

        from trainer.model import reconstruction_target

        cfg = self.cfg.loss
        z, y = self.engine(x, clamp=False)  # the loss pulls back pixels outside [0, 1] too
        target = reconstruction_target(x, y.shape[1])
        recon = F.mse_loss(y.float(), target.float())
        total = cfg.recon_weight * recon
        parts = {"recon_loss": recon.detach()}
        fake, cond = y, z
        if t_lat is None and self.teacher is not None:
            t_lat = self._teacher_latents(x)
        if t_lat is not None:
            t_lat = t_lat.to(z.dtype)
            enc = F.mse_loss(z.float(), t_lat.float())
            total = total + cfg.distill_encoder_weight * enc
            parts["distill_loss"] = enc.detach()
            cond = t_lat
            if cfg.decoder_on_teacher_latents:
                y_t = self.engine.module.decode(t_lat, clamp=False)
                dec = F.mse_loss(y_t.float(), reconstruction_target(x, y_t.shape[1]).float())
                total = total + dec
                parts["decoder_teacher_loss"] = dec.detach()
                fake = y_t
        if self.adversary is not None:
            # the decoder's adversarial correction, on what it decodes from the teacher's latents when
            # the recipe trains it on them (the author's), else on its own reconstruction
            real = reconstruction_target(x, fake.shape[1])
            adv = self.adversary.generator_loss(fake, real, cond)
            total = total + self.cfg.adversarial.weight * adv
            parts["adv_g_loss"] = adv.detach()
            self._adv_inputs = (fake.detach(), real.detach(), cond.detach())
        return total, parts

    # ---------------------------------------------------------------- validation
    def validate(self) -> dict:
        import torch

        from trainer.metrics import psnr_from_mse, ssim_per_frame
        from trainer.model import reconstruction_target

        if self.val_set is None:
            return {}
        self.engine.eval()
        sums = [0.0, 0.0, 0.0, 0.0, 0.0]  # psnr, ssim, clips; EMA psnr, ssim
        ema_model = self._ema_validation_model() if self.ema is not None else None
        with torch.no_grad():
            # every rank runs the same number of forward passes (ZeRO-3 gathers in each)
            for index, seed, counts in validation_items(len(self.val_set), self.rank, self.world):
                item = self.val_set[(index, seed)]
                self._report_skips(item["skipped"])
                x = self._to_input(item["video"][None])
                for model, at in ((self.engine, 0), (ema_model, 3)):
                    if model is None:
                        continue
                    _z, y = model(x)
                    target = reconstruction_target(x, y.shape[1])
                    if counts:
                        mse = torch.mean((y.float() - target.float()) ** 2).item()
                        sums[at] += psnr_from_mse(mse)
                        sums[at + 1] += ssim_per_frame(y.float(), target.float()).mean().item()
                sums[2] += 1 if counts else 0
        self.engine.train()
        psnr_sum, ssim_sum, n, ema_psnr_sum, ema_ssim_sum = self._all_reduce(sums)
        if n == 0:
            return {}
        result = {"step": self.step, "psnr": psnr_sum / n, "ssim": ssim_sum / n, "n_clips": int(n)}
        if ema_model is not None:
            result.update(ema_psnr=ema_psnr_sum / n, ema_ssim=ema_ssim_sum / n)
        self.last_val = result
        if self.is_main:
            assert self.tb is not None  # rank 0 writes TensorBoard
            self.events.emit("val", **result)
            for key in ("psnr", "ssim", "ema_psnr", "ema_ssim"):
                if key in result:
                    self.tb.add_scalar(f"val/{key}", result[key], self.step)
            ema_text = f"; EMA PSNR {result['ema_psnr']:.2f} dB" if ema_model is not None else ""
            print(
                f"[taehv-train] val step {self.step}: PSNR {result['psnr']:.2f} dB SSIM {result['ssim']:.4f}"
                f"{ema_text}",
                flush=True,
            )
        # with EMA on, the EMA weights are what a user takes away, so they choose best/; the untrained
        # model (a validation at step 0) is a baseline, never the best weights
        chosen = result["ema_psnr"] if ema_model is not None else result["psnr"]
        if self.step > 0 and chosen > self.best_psnr:
            self.best_psnr = chosen
            self._export("best", {**result, "chosen_by": "ema_psnr" if ema_model is not None else "psnr"})
        return result

    def _ema_validation_model(self):
        """A plain (non-DeepSpeed) model on this device holding the whole EMA weights: every rank
        validates the EMA without disturbing the engine's (possibly partitioned) parameters."""
        from trainer.model import build_model

        weights = self.ema.full_weights()  # collective
        if self._ema_model is None:
            model = build_model(self.cfg.model.model_copy(update={"init_weights": ""}))
            self._ema_model = model.to(self.device, self.model_dtype).eval()
        self._ema_model.load_state_dict(weights)
        return self._ema_model

    def _export(self, name: str, info: dict) -> None:
        """Write consolidated weights to RUN/<name>/taehv.safetensors (collective)."""
        from safetensors.torch import save_file

        weights = self.full_weights()
        ema = self.full_weights(use_ema=True) if self.ema is not None else None
        if self.is_main:
            assert weights is not None  # rank 0 holds them
            out = self.run_dir / name
            out.mkdir(exist_ok=True)
            save_file(weights, str(out / ".taehv.safetensors.tmp"))
            os.replace(out / ".taehv.safetensors.tmp", out / "taehv.safetensors")
            if ema is not None:
                save_file(ema, str(out / ".taehv_ema.safetensors.tmp"))
                os.replace(out / ".taehv_ema.safetensors.tmp", out / "taehv_ema.safetensors")
            atomic_write_text(out / "info.json", _json(**info, preset=self.cfg.run.preset))

    # ---------------------------------------------------------------- the loop
    def train(self) -> int:
        from torch.utils.tensorboard import SummaryWriter

        cfg = self.cfg
        self.tb = SummaryWriter(str(self.run_dir / "tensorboard")) if self.is_main else None
        self.last_saved_step = self.step if self.resume_from else -1
        self.events.emit(
            "start",
            world_size=self.world,
            node=socket.gethostname(),
            local_rank=self.local_rank,
            preset=cfg.run.preset,
            resumed_from=str(self.resume_from.path) if self.resume_from else None,
            max_steps=cfg.optim.max_steps,
            step=self.step,
            zero_stage=self.zero_stage,
            precision=self.precision,
            nonfinite_guard=self.nonfinite_guard,
            skipped_checkpoints=[f"{s.path.name}: {'; '.join(s.problems)}" for s in self.skipped_checkpoints],
            abandoned=str(self.abandoned) if self.abandoned else None,
            **self._recipe_fields(),
        )
        self.events.heartbeat(self.step)
        if self.is_main:
            for s in self.skipped_checkpoints:
                print(
                    f"[taehv-train] not resuming from {s.path}: {s.state}: {'; '.join(s.problems)}",
                    flush=True,
                )
            if self.resume_from:
                print(f"[taehv-train] resumed from {self.resume_from.path} at step {self.step}", flush=True)
        stop_reason = "done"
        if cfg.schedule.val_at_start and self.step == 0:
            self.validate()
        while self.step < cfg.optim.max_steps:
            stop_now = self.train_step()
            if stop_now:
                stop_reason = "signal"
                break
            if self.step % cfg.schedule.val_every == 0:
                self.validate()
            if self.step % cfg.schedule.checkpoint_every == 0:
                self.save_checkpoint("interval")
        if stop_reason == "done" and (self.last_val is None or self.last_val["step"] != self.step):
            self.validate()
        if self.last_saved_step != self.step:
            self.save_checkpoint("stop" if stop_reason == "signal" else "final")
        if stop_reason == "done":
            self._export("final", {"step": self.step, "last_val": self.last_val})
        self.events.emit(
            "stop", step=self.step, reason=stop_reason, exit_status=0, signal=self.stop.signal_name or None
        )
        self.events.heartbeat(self.step, stopped=True)
        if self.tb:
            self.tb.close()
        self._leave_world()
        return EXIT_OK

    def _leave_world(self) -> None:
        """Leave together and take the process group down: rank 0 still writes the exported weights
        after the last collective, and NCCL wants its communicators destroyed. On gloo this alone
        does not stop the SIGABRT a finalising interpreter now and then met ("terminate called
        without an active exception", so torchrun called a finished run failed): the process then
        leaves without finalising (trainer.cli.entry, trainer.hard_exit)."""
        self._barrier()
        self.engine.destroy()
        self.accelerator.end_training()

    def _recipe_fields(self) -> dict:
        """What the start event says of the recipe: where the teacher's latents come from (a cached run
        shows it never loaded the teacher) and, with the adversarial term, the discriminator it starts
        from (its digest equals the checkpoint's after a resume)."""
        teacher = (
            "cache" if self.latent_cache is not None else ("online" if self.teacher is not None else None)
        )
        out: dict[str, Any] = {"teacher": teacher, "teacher_loaded": self.teacher is not None}
        if self.adversary is not None:
            out["discriminator_digest"] = self.adversary.digest()
            out["discriminator_steps"] = self.adversary.optimizer_steps()
        return out

    def train_step(self) -> bool:
        """One optimizer step (grad_accum micro-batches). Returns True when all ranks agreed to stop."""
        import torch

        cfg = self.cfg
        t0 = time.time()
        self.collective_wait_s = 0.0
        data_wait_s = 0.0  # this rank blocked on its loader: the share says whether workers keep up
        lr = lr_at(self.step, cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        done, tries = 0, 0
        stop_agreed = False
        while done < cfg.optim.grad_accum:
            tries += 1
            if tries > 10 * cfg.optim.grad_accum:
                raise RuntimeError(
                    f"{tries - 1} micro-batches in a row had a non-finite loss on some rank; giving up"
                )
            waited = time.perf_counter()
            batch = self._next_batch()
            data_wait_s += time.perf_counter() - waited
            self.faults.sleep("delay", self.step)
            self.faults.maybe_raise(self.step)
            # cached-latent batches carry no jitter: their targets were encoded from unjittered frames
            jitter = batch.get("jitter") if self.cfg.data.color_jitter > 0 else None
            x = self._to_input(batch["video"], jitter)
            t_lat = batch.get("latents")
            loss, parts = self.compute_loss(
                x, None if t_lat is None else t_lat.to(self.device, non_blocking=True)
            )
            if self.faults.nan_loss(self.step):
                loss = loss * float("nan")
            self.faults.sleep("stall", self.step)
            if self.nonfinite_guard == "deepspeed-step":
                # nothing read back to the host: the loss stays on the device until the log interval
                finite = torch.isfinite(loss)
                self.engine.backward(loss)
                self.engine.step()
                done += 1
                self.metrics.add_micro_batch(
                    {
                        k: torch.where(finite, v.detach().float(), 0.0)
                        for k, v in {"loss": loss, **parts}.items()
                    }
                )
                continue
            # One small collective per micro-batch: any rank's non-finite loss skips it everywhere,
            # any rank's stop request stops everywhere at the end of this step.
            bad, stop = self._all_reduce(
                [0.0 if torch.isfinite(loss).item() else 1.0, 1.0 if self.stop.requested else 0.0], op="max"
            )
            stop_agreed = stop_agreed or stop > 0
            if bad > 0:
                self.nonfinite_skipped += 1
                del loss, parts
                if self.zero_stage == 3:
                    # a forward with no backward leaves gathered/prefetched ZeRO-3 params in flight
                    self.engine.empty_partition_cache()
                if self.is_main:
                    print(
                        f"[taehv-train] step {self.step}: non-finite loss on some rank; micro-batch skipped "
                        f"on all ranks ({self.nonfinite_skipped} so far)",
                        file=sys.stderr,
                        flush=True,
                    )
                continue
            self.engine.backward(loss)
            self.engine.step()
            if self.adversary is not None:
                parts["adv_d_loss"] = self.adversary.discriminator_step(*self._adv_inputs)
                self._adv_inputs = None
            done += 1
            self.metrics.add_micro_batch({"loss": loss.detach(), **parts})
        if self.nonfinite_guard == "deepspeed-step":
            # one small collective per optimizer step, after the update: any rank's stop request
            # stops every rank here
            stop_agreed = self._all_reduce([1.0 if self.stop.requested else 0.0], op="max")[0] > 0
            skipped = self.engine.skipped_steps - self._ds_skipped_seen
            self._ds_skipped_seen = self.engine.skipped_steps
            if skipped:
                self.nonfinite_skipped += skipped
                if self.is_main:
                    print(
                        f"[taehv-train] step {self.step + 1}: non-finite gradients on some rank; DeepSpeed "
                        f"skipped the update ({self.nonfinite_skipped} so far)",
                        file=sys.stderr,
                        flush=True,
                    )
        if self.ema is not None:
            self.ema.update()
        self.step += 1
        step_time = time.time() - t0
        self.metrics.add_step(self.engine.get_global_grad_norm(), step_time)
        self.data_wait_log_s += data_wait_s
        self.events.heartbeat(
            self.step,
            step_time_s=step_time,
            wait_s=round(self.collective_wait_s, 6),
            data_wait_s=round(data_wait_s, 6),
        )
        if self.step % cfg.schedule.log_every == 0 or self.step in (1, cfg.optim.max_steps) or stop_agreed:
            self._log_metrics(lr)
        return stop_agreed

    def _log_metrics(self, lr: float) -> None:
        """Means since the last log, reduced over ranks: the one place metrics leave the device
        (collective; every rank calls it at the same steps)."""
        import torch

        from trainer.metrics import psnr_from_mse

        t0 = time.time()
        data_wait_s = self.data_wait_log_s / max(1, self.metrics.steps)
        self.data_wait_log_s = 0.0
        means, grad_norm, step_time = self.metrics.reduce(self.world)
        self.collective_wait_s += time.time() - t0
        gpu_mem = torch.cuda.max_memory_allocated() / 2**30 if self.device_kind == "cuda" else None
        self.last = {
            "step": self.step,
            "loss": means["loss"],
            "recon_loss": means["recon_loss"],
            "psnr": psnr_from_mse(means["recon_loss"]),
            "lr": lr,
            "grad_norm": grad_norm,
            "samples_per_s": self.cfg.effective_batch / step_time if step_time > 0 else 0.0,
            "step_time_s": step_time,
            "gpu_mem_gb": gpu_mem,
            "nonfinite_skipped": self.nonfinite_skipped,
            **{k: v for k, v in means.items() if k not in ("loss", "recon_loss")},
            # this rank's own wait for its loader (not reduced: a slow node's loader shows on its ranks)
            "data_wait_s": data_wait_s,
            "data_wait_share": data_wait_s / step_time if step_time > 0 else 0.0,
        }
        self.events.emit("step", **self.last)
        if self.is_main:
            assert self.tb is not None  # rank 0 writes TensorBoard
            for k in ("loss", "recon_loss", "psnr", "lr", "samples_per_s", "step_time_s", *RECIPE_METRICS):
                if k in self.last:
                    self.tb.add_scalar(f"train/{k}", self.last[k], self.step)
            if grad_norm is not None:
                self.tb.add_scalar("train/grad_norm", grad_norm, self.step)
            print(
                f"[taehv-train] step {self.step}/{self.cfg.optim.max_steps} loss {self.last['loss']:.5f} "
                f"psnr {self.last['psnr']:.2f} lr {lr:.3g} {self.last['samples_per_s']:.2f} clips/s",
                flush=True,
            )


def _json(**fields) -> str:
    import json

    return json.dumps(fields, indent=1)


def run(run_dir: str | Path, resume: str | None = None, weights_only: bool = False) -> int:
    """Entry for one rank. Config and data problems are reported before any process group starts."""
    from trainer.config import ConfigError
    from trainer.latent_cache import CacheError
    from trainer.teacher import TeacherError

    run_dir = Path(run_dir)
    try:
        cfg = load_config(run_dir / "run.toml")
        # fail fast, before any collective: every rank checks its own view of the data
        find_videos(cfg.data.source, cfg.data.root)
        teacher, cache = _recipe_inputs(cfg)
    except (ConfigError, DataSourceError, TeacherError, CacheError) as err:
        print(f"[taehv-train] error: {err}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    trainer = Trainer(run_dir, cfg, resume, weights_only, teacher=teacher, latent_cache=cache)
    try:
        trainer.setup()
        trainer.build()
        trainer.build_data()
        return trainer.train()
    except (ckpt.CheckpointError, DataSourceError, SetupError) as err:
        _report_error(trainer, err)
        return EXIT_CONFIG
    except Exception as err:  # noqa: BLE001 - report, then fail the rank so the launcher sees it
        _report_error(trainer, err)
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


def _recipe_inputs(cfg: TrainConfig):
    """(teacher on the CPU, None) for online distillation, (None, cache manifest) for cached latents,
    (None, None) without a teacher. Raises TeacherError/CacheError: a distilling run never falls back
    to reconstruction-only."""
    from trainer.latent_cache import open_cache
    from trainer.teacher import TeacherError, load_teacher, probe_teacher

    if cfg.loss.teacher_cache:
        return None, open_cache(cfg.loss.teacher_cache, cfg)
    if not cfg.loss.teacher:
        return None, None
    teacher = load_teacher(cfg.loss.teacher, cfg.loss.teacher_subfolder, cfg.model.latent_channels)
    probe = probe_teacher(teacher, cfg.model.latent_channels)
    if not probe.ok:
        raise TeacherError(
            f"loss.teacher = {cfg.loss.teacher!r}: latents of shape {probe.latent_shape} for a "
            f"test clip, the student needs {probe.expected} (T/4 x C x H/8 x W/8)"
        )
    return teacher, None


def _report_error(trainer: Trainer, err: BaseException) -> None:
    tb = traceback.format_exc()
    print(f"[taehv-train] error: {err}\n{tb}", file=sys.stderr, flush=True)
    events = getattr(trainer, "events", None)
    if events is not None:
        events.emit("error", message=str(err), traceback="".join(tb.splitlines(True)[-12:]))
        events.emit("stop", step=getattr(trainer, "step", 0), reason="error", exit_status=1)
