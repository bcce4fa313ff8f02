"""TensorBoard logdirs read with tensorboard's own loader: scalars as torch's SummaryWriter writes
them, incrementally, across runs in subdirectories, through a record cut in half; and a monitor
attached to a logdir alone (a run started by another tool)."""

from __future__ import annotations

import numpy as np
import pytest
from torch.utils.tensorboard import SummaryWriter

from taehv_console.core.watch.monitor import snapshot_once
from taehv_console.core.watch.tbscalars import TensorBoardScalars
from tests.core.watch.conftest import fast_config


def _write(logdir, steps, start=1, tags=("train/loss", "train/psnr")):
    w = SummaryWriter(str(logdir))
    for s in range(start, start + steps):
        for tag in tags:
            w.add_scalar(tag, s * (0.5 if "loss" in tag else 10.0), s)
    w.add_histogram("weights/conv0", np.array([0.1, 0.2, 0.3]), start)  # not a scalar: ignored
    w.add_text("notes", "hello", start)
    w.flush()
    return w


def test_scalars_incrementally_and_nothing_twice(tmp_path):
    w = _write(tmp_path, 3)
    tb = TensorBoardScalars(tmp_path)
    first = tb.poll()
    assert sorted({p.tag for p in first}) == ["train/loss", "train/psnr"]
    assert [(p.step, p.value) for p in first if p.tag == "train/loss"] == [(1, 0.5), (2, 1.0), (3, 1.5)]
    assert tb.poll() == []
    w.add_scalar("train/loss", 9.0, 4)
    w.flush()
    assert [(p.tag, p.step, p.value) for p in tb.poll()] == [("train/loss", 4, 9.0)]
    w.close()
    assert {s.name: len(s.points) for s in tb.series()} == {"train/loss": 4, "train/psnr": 3}


def test_runs_in_subdirectories_are_named_by_their_path(tmp_path):
    _write(tmp_path / "run-a", 2).close()
    _write(tmp_path / "run-b" / "eval", 1, tags=("val/psnr",)).close()
    tb = TensorBoardScalars(tmp_path)
    tb.poll()
    assert [s.name for s in tb.series()] == ["run-a/train/loss", "run-a/train/psnr", "run-b/eval/val/psnr"]


def test_a_record_cut_in_half_is_read_once_it_is_complete(tmp_path):
    src = tmp_path / "full"
    _write(src, 5).close()
    event_file = next(src.glob("events.out.tfevents.*"))
    data = event_file.read_bytes()
    dst = tmp_path / "growing"
    dst.mkdir()
    target = dst / event_file.name
    target.write_bytes(data[: len(data) - 30])  # the writer is in the middle of its last record
    tb = TensorBoardScalars(dst)
    got = tb.poll()
    with open(target, "ab") as f:
        f.write(data[len(data) - 30 :])
    got += tb.poll()
    full = TensorBoardScalars(src).poll()
    assert [(p.tag, p.step, p.value) for p in got] == [(p.tag, p.step, p.value) for p in full]


def test_monitor_on_a_tensorboard_logdir_alone(tmp_path):
    _write(tmp_path / "tb", 6, tags=("train/loss", "train/psnr", "train/lr", "val/psnr")).close()
    run = tmp_path / "foreign-run"  # no events, no heartbeats: another tool's run
    s = snapshot_once(run, tensorboard=tmp_path / "tb", config=fast_config())
    assert s.history.loss.values == pytest.approx([0.5 * i for i in range(1, 7)])
    assert s.history.val_psnr.points[-1] == (6.0, 60.0)
    assert {x.name for x in s.scalars} == {"train/loss", "train/psnr", "train/lr", "val/psnr"}
    assert next(x for x in s.sources if x.name == "tensorboard").ok


def test_the_trainers_own_logdir(tmp_path):
    # the tags the trainer writes (train/loss ... val/psnr) map onto the snapshot's histories
    _write(tmp_path, 2, tags=("train/loss", "train/samples_per_s")).close()
    s = snapshot_once(tmp_path / "run", tensorboard=tmp_path, config=fast_config())
    assert s.history.clips_per_s.values == pytest.approx([10.0, 20.0]) and s.history.loss.values == (0.5, 1.0)
