"""The checkpoint manager: which checkpoint a run resumes from, and the collective save, load,
universal load and weight export by docs/design.md's checkpoint contract (the files and their
checks are trainer.checkpoint's)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file

from trainer import checkpoint as ckpt
from trainer.config import TrainConfig
from trainer.discriminator import WEIGHTS as DISC_WEIGHTS
from trainer.events import atomic_write_json
from trainer.families import exported_files
from trainer.master_weights import MasterEMA
from trainer.runtime import Runtime
from trainer.state import TrainState

if TYPE_CHECKING:
    from trainer.learner import Learner


def write_exported(tensors: dict[str, torch.Tensor], path: Path, meta: dict[str, str]) -> None:
    """`path` (.safetensors, with `meta` in its header) and the same weights as a torch.save'd state
    dict beside it (.pth, the author's format: his class reads only torch.load files and tells the
    family by the file's name). Each appears whole or not at all."""
    pth = path.with_suffix(".pth")
    save_file(tensors, str(path.parent / f".{path.name}.tmp"), metadata=meta)
    torch.save({k: v.contiguous() for k, v in tensors.items()}, path.parent / f".{pth.name}.tmp")
    os.replace(path.parent / f".{path.name}.tmp", path)
    os.replace(path.parent / f".{pth.name}.tmp", pth)


class CheckpointManager:
    def __init__(self, rt: Runtime, cfg: TrainConfig):
        self.rt = rt
        self.cfg = cfg
        self.root = rt.run_dir / "checkpoints"
        if rt.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
        self.resume_from: ckpt.CheckpointStatus | None = None
        self.skipped: list[ckpt.CheckpointStatus] = []  # newer checkpoints not resumed from, and why
        self.universal = False  # resuming from step-<N>/universal at another world size
        self.abandoned: Path | None = None  # where a resume --from moved the newer checkpoints
        # (samples per rank, world) of a universal checkpoint's source: the data position to rescale
        self.rescale_data_from: tuple[int, int] | None = None

    # ---------------------------------------------------------------- choosing
    def resolve(self, spec: str | None, weights_only: bool) -> None:
        """Pick the checkpoint `spec` names (or none), and refuse early what cannot load here."""
        if not spec:
            return
        self.resume_from, self.skipped = ckpt.resolve_resume(self.root, spec)
        src = self.resume_from
        if src and src.world_size != self.rt.world and not weights_only:
            problem = ckpt.universal_problem(src.path)
            if problem:
                raise ckpt.CheckpointError(
                    f"{src.path} was written by {src.world_size} processes, this run has {self.rt.world}: "
                    f"its ZeRO optimizer shards load only at that world size ({problem}). Either convert it "
                    "once to DeepSpeed's universal checkpoint, which loads at any world size: "
                    f"{shlex.join(ckpt.universal_command(src.path))} and resume again, or resume "
                    "weights-only with a fresh optimizer (taehv-train --resume ... --weights-only)."
                )
            self.universal = True
        if src and spec != "latest":
            self._start_timeline(src)

    def _start_timeline(self, source: ckpt.CheckpointStatus) -> None:
        """Resuming from a chosen checkpoint makes its line of history the current one: newer
        checkpoints move aside (kept) and `latest` names the source, so neither a later
        `resume latest` nor retention acts on the abandoned line."""
        self.rt.collectives.barrier()  # every rank has verified the source before anything moves
        if self.rt.is_main:
            self.abandoned = ckpt.abandon_newer(self.root, source.step)
            if source.path.parent.resolve() == self.root.resolve():
                ckpt.write_latest(self.root, source.path.name)
            if self.abandoned:
                self.rt.log.info(
                    f"resuming from {source.path.name}: the newer checkpoints of the old timeline "
                    f"were moved to {self.abandoned} (kept, never resumed from automatically)"
                )
        self.rt.collectives.barrier()

    # ---------------------------------------------------------------- saving
    def save(self, reason: str, state: TrainState, learner: Learner) -> bool:
        """Every rank writes its part into step-<N>.tmp; rank 0 checks and renames it. True when the
        checkpoint is complete (agreed by all ranks)."""
        rt, step = self.rt, state.step
        tmp = self.root / f"step-{step}.tmp"
        t0 = time.time()
        if rt.is_main:
            if tmp.exists():  # left by a save that died; never reused as it is
                shutil.rmtree(tmp)
            (tmp / "trainer").mkdir(parents=True)
            rt.events.emit("checkpoint", step=step, path=str(tmp), status="started", reason=reason)
        rt.collectives.barrier()
        with ckpt.disk_full_named(tmp):
            learner.engine.save_checkpoint(
                str(tmp), tag=ckpt.DS_TAG, client_state={"step": step}, save_latest=False
            )
            weights = learner.full_weights()
            ema_weights = learner.full_weights(use_ema=True) if learner.ema is not None else None
            torch.save(
                {
                    "torch_rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state() if rt.device_kind == "cuda" else None,
                    "samples_consumed": state.samples_consumed,
                    "ema": learner.ema.state() if learner.ema is not None else None,
                },
                tmp / ckpt.rank_state_name(rt.rank),
            )
            if rt.is_main:
                # weights.safetensors keeps its name (resume and eval read it); the family and run
                # go in its header, and <family>.pth beside it loads into the author's class by name
                meta = {"family": self.cfg.model.family, "run": rt.run_dir.name, "step": str(step)}
                save_file(weights, str(tmp / ckpt.WEIGHTS), metadata=meta)
                torch.save(
                    weights, tmp / exported_files(self.cfg.model.family)[0].replace(".safetensors", ".pth")
                )
                if ema_weights is not None:
                    save_file(ema_weights, str(tmp / "weights_ema.safetensors"))
                if learner.adversary is not None:
                    learner.adversary.save(tmp)  # every rank holds the same discriminator: rank 0's is it
                atomic_write_json(
                    tmp / "trainer" / "state.json",
                    {**state.state_dict(), "world_size": rt.world, "preset": self.cfg.run.preset},
                )
        rt.faults.sleep("ckpt_sleep", step)
        rt.collectives.barrier()
        ok, message, final = 1.0, "", None
        if rt.is_main:
            try:
                final = ckpt.finalize(
                    tmp,
                    step,
                    rt.world,
                    learner.zero_stage,
                    {"preset": self.cfg.run.preset, "parts": list(learner.parts)},
                    parts=learner.parts,
                )
            except (ckpt.CheckpointError, OSError) as err:
                ok, message = 0.0, str(err)
        # only rank 0 can say 1: a sum of 1 means done
        done = bool(rt.collectives.all_reduce([ok])[0] if rt.world > 1 else ok)
        if rt.is_main:
            seconds = round(time.time() - t0, 3)
            if done:
                assert final is not None  # done: rank 0 finalized it
                # pruning only ever follows a complete save
                protect = (self.resume_from.path,) if self.resume_from else ()
                ckpt.prune(self.root, self.cfg.schedule.keep_checkpoints, step, protect=protect)
                nbytes = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
                rt.events.emit(
                    "checkpoint",
                    step=step,
                    path=str(final),
                    seconds=seconds,
                    bytes=nbytes,
                    status="complete",
                    reason=reason,
                )
            else:
                rt.events.emit(
                    "checkpoint",
                    step=step,
                    path=str(tmp),
                    seconds=seconds,
                    bytes=0,
                    status="failed",
                    reason=reason,
                    message=message,
                )
                rt.log.warning(f"checkpoint at step {step} FAILED: {message}")
        state.last_saved_step = step
        rt.collectives.barrier()
        return done

    def export(self, name: str, info: dict[str, Any], learner: Learner) -> None:
        """Consolidated weights (and the EMA's) to RUN/<name>/<family>.safetensors, with the family and
        the run in its metadata, and <family>.pth beside it. Collective."""
        weights = learner.full_weights()
        ema = learner.full_weights(use_ema=True) if learner.ema is not None else None
        if not self.rt.is_main:
            return
        out = self.rt.run_dir / name
        out.mkdir(exist_ok=True)
        meta = {"family": self.cfg.model.family, "run": self.rt.run_dir.name, "preset": self.cfg.run.preset}
        for tensors, file in zip((weights, ema), exported_files(self.cfg.model.family)):
            if tensors is not None:
                write_exported(tensors, out / file, meta)
        atomic_write_json(out / "info.json", {**info, "preset": self.cfg.run.preset})

    # ---------------------------------------------------------------- loading
    def load(self, state: TrainState, learner: Learner, weights_only: bool) -> None:
        """Resume `resume_from` into the engine (a weights-only resume loaded the weights into the
        model before the engine was built) and into `state`."""
        st, rt = self.resume_from, self.rt
        assert st is not None  # called only when resolve() chose a checkpoint
        if self.universal:
            self._load_universal(st, learner)
        elif not weights_only:
            load_path, _ = learner.engine.load_checkpoint(
                str(st.path), tag=ckpt.DS_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
            )
            if load_path is None:
                raise ckpt.CheckpointError(f"{st.path}: DeepSpeed found nothing to load")
            own = st.path / ckpt.rank_state_name(rt.rank)
            rank_state = torch.load(own, map_location="cpu", weights_only=True)
            torch.set_rng_state(rank_state["torch_rng"])
            if rt.device_kind == "cuda" and rank_state.get("cuda_rng") is not None:
                torch.cuda.set_rng_state(rank_state["cuda_rng"])
            state.samples_consumed = int(rank_state["samples_consumed"])
            if learner.ema is not None and rank_state.get("ema") is not None:
                try:
                    learner.ema.load(rank_state["ema"], str(own))
                except ValueError as err:
                    raise ckpt.CheckpointError(str(err)) from None
        if learner.adversary is not None:
            if (st.path / DISC_WEIGHTS).is_file():
                learner.adversary.load(st.path)
            else:
                rt.log.info(f"{st.path} has no discriminator: the adversarial term starts with a fresh one")
        state.load_state_dict(json.loads((st.path / "trainer" / "state.json").read_text()))
        if weights_only:
            # a fresh optimizer on another world size: the data position restarts for this world
            o = self.cfg.optim
            state.samples_consumed = (
                state.step * o.grad_accum * o.batch_per_gpu // self.cfg.data.crops_per_clip
            )

    def _load_universal(self, st: ckpt.CheckpointStatus, learner: Learner) -> None:
        """Weights and optimizer state from step-<N>/universal at this world size. Step and LR come
        from state.json as usual; the data position is rescaled when the data is built; EMA restarts
        from the loaded weights (its shards follow the old partitioning)."""
        load_path, _ = learner.engine.load_checkpoint(
            str(st.path), tag=ckpt.UNIVERSAL, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if load_path is None:
            raise ckpt.CheckpointError(f"{st.path / ckpt.UNIVERSAL}: DeepSpeed found nothing to load")
        rank0 = torch.load(st.path / ckpt.rank_state_name(0), map_location="cpu", weights_only=True)
        assert st.world_size is not None  # a universal load is chosen for a known, different world size
        self.rescale_data_from = (int(rank0["samples_consumed"]), int(st.world_size))
        if learner.ema is not None:
            learner.ema = MasterEMA(
                learner.engine, self.cfg.optim.ema_decay
            )  # from the loaded master weights
        self.rt.log.info(
            f"loaded the universal checkpoint {st.path / ckpt.UNIVERSAL} "
            f"(written by {st.world_size} processes) at {self.rt.world}"
        )
