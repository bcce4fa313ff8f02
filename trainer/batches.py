"""The data path of one rank: the train/validation split, the training loader (decoded clips, or
the teacher latent cache), the position in the data that checkpoints carry, and the hand-over of a
uint8 batch to the device as the model's input."""

from __future__ import annotations

from typing import Any

import torch

from trainer import checkpoint as ckpt
from trainer.augment import to_model_input
from trainer.config import TrainConfig
from trainer.data import VideoClipDataset, find_videos, make_train_loader, split_train_val
from trainer.latent_cache import CachedLatentDataset, make_cached_loader
from trainer.prefetch import Prefetcher
from trainer.runtime import Runtime
from trainer.state import TrainState


class Batches:
    """Training batches for this rank from `state.samples_consumed` on; the validation set."""

    def __init__(
        self,
        rt: Runtime,
        cfg: TrainConfig,
        state: TrainState,
        latent_cache: dict[str, Any] | None,
        rescale_from: tuple[int, int] | None = None,
    ):
        self.rt = rt
        self.cfg = cfg
        self.state = state
        self.dtype = rt.model_dtype
        # with model.compile the input's ~ten elementwise passes (scale, jitter) fuse into one kernel
        self._to_model_input = (
            torch.compile(to_model_input, dynamic=False) if cfg.model.compile else to_model_input
        )
        videos = find_videos(cfg.data.source, cfg.data.root)
        self.train_paths, self.val_paths = split_train_val(
            videos, cfg.data.val_fraction, cfg.data.val_max_clips
        )
        self.val_set = VideoClipDataset(self.val_paths, cfg.data, train=False) if self.val_paths else None
        self.train_set: VideoClipDataset | CachedLatentDataset
        if latent_cache is not None:
            # validation decodes its clips as usual (it needs no teacher); training reads the cache
            cached = CachedLatentDataset(cfg.loss.teacher_cache, latent_cache, self.train_paths, cfg.data)
            if cached.unusable:
                rt.log.info(
                    f"latent cache: {len(cached.unusable)} clip(s) have no cached window "
                    f"(too short or too small) and are left out, e.g. {cached.unusable[0]}"
                )
            self.train_set = cached
        else:
            self.train_set = VideoClipDataset(self.train_paths, cfg.data, train=True)
        if rescale_from:  # a universal checkpoint written at another world size
            consumed, old_world = rescale_from
            state.samples_consumed = ckpt.rescaled_data_position(
                consumed, old_world, rt.world, len(self.train_set)
            )
        where = (
            rt.rank,
            rt.world,
            cfg.run.seed,
            cfg.optim.batch_per_gpu,
            state.samples_consumed,
            cfg.data.num_workers,
            cfg.data.prefetch_factor,
        )
        if isinstance(self.train_set, CachedLatentDataset):
            self.loader = make_cached_loader(self.train_set, *where)
        else:
            self.loader = make_train_loader(self.train_set, *where)
        self.prefetcher = Prefetcher(iter(self.loader), rt.device)  # on a GPU: copied one batch ahead

    def next(self) -> dict[str, Any]:
        batch = next(self.prefetcher)
        self.state.samples_consumed += len(batch["index"])  # sampler items (data.crops_per_clip crops each)
        self.report_skips(batch["skipped"])
        return batch

    def report_skips(self, skipped: list[dict[str, str]]) -> None:
        for s in skipped:
            self.state.data_skipped += 1
            self.rt.events.emit(
                "data",
                step=self.state.step,
                path=s["path"],
                reason=s["reason"],
                count=self.state.data_skipped,
            )
            self.rt.log.warning(f"rank {self.rt.rank}: skipped {s['path']}: {s['reason']}", every_rank=True)

    def to_input(self, video_u8: torch.Tensor, jitter: torch.Tensor | None = None) -> torch.Tensor:
        """uint8 crosses the loader and the bus (training batches are on the device already: the
        prefetcher moved them); float conversion and colour jitter happen on the device."""
        return self._to_model_input(video_u8.to(self.rt.device, non_blocking=True), self.dtype, jitter)
