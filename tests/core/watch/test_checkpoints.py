"""Checkpoint status with the trainer's own protocol and verification: complete / in progress /
incomplete (half-written directories, truncated shards, a .tmp left by a dead run), what `latest`
names, and the next save due. Checkpoints here are written by trainer.checkpoint.finalize from real
torch.save archives; the live tests (test_live.py) check real DeepSpeed checkpoints too."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from taehv_console.core.watch.checkpoints import CheckpointWatcher, RunActivity
from taehv_console.core.watch.state import CheckpointState
from trainer import checkpoint as ckpt

LIVE = RunActivity(live=True, step=1500, max_steps=10_000, every=1000, events={})


def write_rank_files(d: Path, world: int = 2, zero_stage: int = 2) -> None:
    from safetensors.torch import save_file

    d.mkdir(parents=True, exist_ok=True)
    for alternatives in ckpt.required_files(world, zero_stage):
        p = d / alternatives[0]
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.suffix == ".pt":
            torch.save({"w": torch.arange(2048, dtype=torch.float32)}, p)
        elif p.suffix == ".safetensors":
            save_file({"w": torch.zeros(64)}, str(p))
        else:
            p.write_text('{"step": 0}')


def complete(root: Path, step: int) -> Path:
    tmp = root / f"step-{step}.tmp"
    write_rank_files(tmp)
    return ckpt.finalize(tmp, step, world_size=2, zero_stage=2)


def by_name(summary):
    return {c.name: c for c in summary.items}


def test_complete_checkpoints_with_size_age_latest_and_next_due(tmp_path):
    root = tmp_path / "checkpoints"
    complete(root, 500)
    complete(root, 1000)
    s = CheckpointWatcher(root).summary(LIVE, now=time.time() + 10)
    assert [c.name for c in s.items] == ["step-1000", "step-500"]  # newest first
    c = s.items[0]
    assert c.state is CheckpointState.COMPLETE and c.is_latest and s.latest == "step-1000"
    assert (
        c.bytes
        == sum(f.stat().st_size for f in (root / "step-1000").rglob("*.pt"))
        + (root / "step-1000" / "weights.safetensors").stat().st_size
        + (root / "step-1000" / "trainer/state.json").stat().st_size
    )
    assert c.world_size == 2 and c.zero_stage == 2 and 9 < c.age_s < 60
    assert s.newest_complete_step == 1000 and s.next_due_step == 2000 and s.every == 1000 and not s.problems


def test_half_written_directory_of_a_dead_run_is_incomplete(tmp_path):
    root = tmp_path / "checkpoints"
    complete(root, 1000)
    half = root / "step-2000.tmp"
    write_rank_files(half)
    (half / "trainer" / "rank-1.pt").unlink()  # rank 1 died before writing its part
    dead = RunActivity(live=False, step=1990, every=1000, events={})
    c = by_name(CheckpointWatcher(root).summary(dead))["step-2000.tmp"]
    assert c.state is CheckpointState.INCOMPLETE and "no rank of the run is running" in c.problems[0]
    assert c.bytes > 0
    # the same directory while the run lives and its save has started: being written
    writing = RunActivity(live=True, step=2000, every=1000, events={2000: {"status": "started"}})
    assert (
        by_name(CheckpointWatcher(root).summary(writing))["step-2000.tmp"].state
        is CheckpointState.IN_PROGRESS
    )


def test_tmp_dir_states_while_the_run_lives(tmp_path):
    root = tmp_path / "checkpoints"
    write_rank_files(root / "step-3000.tmp")
    w = CheckpointWatcher(root)
    failed = RunActivity(
        live=True, step=3000, every=1000, events={3000: {"status": "failed", "message": "disk full"}}
    )
    c = by_name(w.summary(failed))["step-3000.tmp"]
    assert c.state is CheckpointState.INCOMPLETE and c.problems[0] == "save failed: disk full"
    # no events from this run (attached to another tool's run): judged by how long it sat untouched
    young = RunActivity(live=True, step=3000, events=None, tmp_grace_s=900)
    assert by_name(w.summary(young))["step-3000.tmp"].state is CheckpointState.IN_PROGRESS
    old = os.stat(root / "step-3000.tmp").st_mtime - 3600
    os.utime(root / "step-3000.tmp", (old, old))
    c = by_name(w.summary(young))["step-3000.tmp"]
    assert c.state is CheckpointState.INCOMPLETE and "untouched for" in c.problems[0]
    # a newer checkpoint completed after it: it can never finish
    complete(root, 4000)
    assert "step 4000 completed after it" in by_name(w.summary(LIVE))["step-3000.tmp"].problems[0]


def test_step_directory_without_manifest_or_marker_is_incomplete(tmp_path):
    # what an accelerate/DeepSpeed save interrupted mid-way leaves: files, no manifest, no COMPLETE
    root = tmp_path / "checkpoints"
    write_rank_files(root / "step-700")
    c = by_name(CheckpointWatcher(root).summary(LIVE))["step-700"]
    assert c.state is CheckpointState.INCOMPLETE
    assert "no COMPLETE marker" in c.problems and any("manifest unreadable" in p for p in c.problems)


def test_a_shard_truncated_after_verification_is_caught_on_the_next_poll(tmp_path):
    root = tmp_path / "checkpoints"
    good = complete(root, 1000)
    w = CheckpointWatcher(root)
    assert by_name(w.summary(LIVE))["step-1000"].state is CheckpointState.COMPLETE
    shard = good / "ds" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    c = by_name(w.summary(LIVE))["step-1000"]
    assert c.state is CheckpointState.INCOMPLETE
    assert any("zero_pp_rank_1_mp_rank_00_optim_states.pt" in p and "manifest says" in p for p in c.problems)


def test_a_shard_damaged_at_the_same_size_is_caught_by_the_zip_directory(tmp_path):
    root = tmp_path / "checkpoints"
    good = complete(root, 1000)
    shard = good / "trainer" / "rank-0.pt"
    data = bytearray(shard.read_bytes())
    data[-200:] = b"\0" * 200  # the central directory at the end of the archive, size unchanged
    shard.write_bytes(bytes(data))
    c = by_name(CheckpointWatcher(root).summary(LIVE))["step-1000"]
    assert c.state is CheckpointState.INCOMPLETE and any("not a readable archive" in p for p in c.problems)


def test_latest_naming_a_bad_or_missing_checkpoint_is_a_problem(tmp_path):
    root = tmp_path / "checkpoints"
    complete(root, 1000)
    (root / "latest").write_text("step-2000\n")
    assert CheckpointWatcher(root).summary(LIVE).problems == ("latest names step-2000, which does not exist",)
    write_rank_files(root / "step-2000")
    s = CheckpointWatcher(root).summary(LIVE)
    assert s.problems[0].startswith("latest names step-2000, which is incomplete: no COMPLETE marker")
    assert s.newest_complete_step == 1000


def test_next_due_is_the_final_step_near_the_end_and_none_without_a_schedule(tmp_path):
    w = CheckpointWatcher(tmp_path / "none")
    assert w.summary(RunActivity(live=True, step=9900, max_steps=10_000, every=1000)).next_due_step == 10_000
    assert w.summary(RunActivity(live=True, step=5)).next_due_step is None
    assert w.summary(RunActivity(live=True, step=5)).items == ()  # no checkpoints dir yet: nothing, no error


def test_deep_verification_runs_once_per_directory(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    complete(root, 1000)
    calls = []
    real = ckpt.verify
    monkeypatch.setattr(ckpt, "verify", lambda p, deep=True: calls.append(deep) or real(p, deep=deep))
    w = CheckpointWatcher(root)
    for _ in range(3):
        w.summary(LIVE)
    assert calls == [True, False, False]
    # a directory replaced under the same name (a re-save of that step) is verified deeply again
    shutil.rmtree(root / "step-1000")
    complete(root, 1000)
    w.summary(LIVE)
    assert calls[-1] is True


@pytest.fixture(autouse=True)
def _no_torch_threads():
    torch.set_num_threads(1)


@pytest.mark.parametrize(
    "content", [b"\xff\xfe\x00garbage\x81", b"not a checkpoint\n"], ids=["binary", "text"]
)
def test_garbage_in_latest_is_a_problem_and_the_checkpoints_still_show(tmp_path, content):
    root = tmp_path / "checkpoints"
    complete(root, 1000)
    (root / "latest").write_bytes(content)
    s = CheckpointWatcher(root).summary(LIVE)
    assert [c.name for c in s.items] == ["step-1000"] and s.items[0].state is CheckpointState.COMPLETE
    assert s.latest is None and not s.items[0].is_latest
    assert len(s.problems) == 1 and str(root / "latest") in s.problems[0] and "ignored" in s.problems[0]
