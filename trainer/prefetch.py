"""The host-to-device hand-over of training batches, one batch ahead.

On a GPU the next batch's copy (a ~100 MB uint8 clip batch at 12×480×720, from the loader's pinned
memory) runs on a side stream while the current batch computes, instead of on the compute stream
in front of it. The CUDA-specific part is `_CudaAhead`, kept small; elsewhere batches pass through.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch


def _moved(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    return {
        k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()
    }


class _CudaAhead:
    """Copies batch n+1 on a side stream while batch n is in use on the compute stream."""

    def __init__(self, batches: Iterator[dict[str, Any]], device: torch.device):
        self.batches = batches
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.ahead: dict[str, Any] | None = None

    def _start(self) -> None:
        batch = next(self.batches, None)
        if batch is None:
            self.ahead = None
            return
        with torch.cuda.stream(self.stream):
            self.ahead = _moved(batch, self.device)

    def __next__(self) -> dict[str, Any]:
        if self.ahead is None:
            self._start()
            if self.ahead is None:
                raise StopIteration
        batch, compute = self.ahead, torch.cuda.current_stream(self.device)
        compute.wait_stream(self.stream)  # the copy is done before the compute stream reads it
        for v in batch.values():
            if isinstance(v, torch.Tensor):
                v.record_stream(compute)  # its memory is not reused while the compute stream holds it
        self._start()
        return batch


class Prefetcher:
    """Iterates `batches` with every tensor on `device`: one batch ahead on a side stream on CUDA,
    batch by batch elsewhere (where a copy is no copy, or nothing overlaps)."""

    def __init__(self, batches: Iterator[dict[str, Any]], device: torch.device):
        self._cuda = _CudaAhead(batches, device) if device.type == "cuda" else None
        self._batches = batches
        self._device = device

    @property
    def side_stream(self) -> bool:
        """Whether batches are copied one ahead on a side stream (a CUDA device)."""
        return self._cuda is not None

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._cuda is not None:
            return next(self._cuda)
        return _moved(next(self._batches), self._device)
