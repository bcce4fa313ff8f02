"""The training batches' hand-over to the device (trainer/prefetch.py). Here, on CPU, batches pass
through batch by batch; the CUDA side-stream path runs in benchmarks/gpu_throughput.py's trainer
mode where a GPU is lent."""

from __future__ import annotations

import pytest
import torch

from trainer.prefetch import Prefetcher


def test_batches_come_through_in_order_with_every_tensor_on_the_device_and_the_rest_untouched():
    batches = [
        {"video": torch.full((1, 2), i, dtype=torch.uint8), "skipped": [f"s{i}"], "index": [i]}
        for i in range(3)
    ]
    pulled = []

    def source():
        for b in batches:
            pulled.append(b["index"][0])
            yield b

    got = Prefetcher(source(), torch.device("cpu"))
    assert not got.side_stream  # a copy on the CPU is no copy: nothing to overlap
    first = next(got)
    assert pulled == [0]  # on CPU nothing is read ahead: a stop loses no batch
    assert (
        first["video"].device.type == "cpu" and int(first["video"][0, 0]) == 0 and first["skipped"] == ["s0"]
    )
    assert [int(b["video"][0, 0]) for b in got] == [1, 2]
    with pytest.raises(StopIteration):
        next(got)
