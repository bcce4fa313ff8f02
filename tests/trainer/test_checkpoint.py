"""The checkpoint protocol on real files: sealing, verification without unpickling, resume choice,
pruning. (Real DeepSpeed saves are exercised in test_training.py.)"""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from trainer import checkpoint as ckpt


def _write_shards(d, world: int, stage: int, bf16: bool = False) -> None:
    for alternatives in ckpt.required_files(world, stage):
        name = alternatives[-1] if bf16 else alternatives[0]
        path = d / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".json"):
            path.write_text(json.dumps({"step": 1}))
        elif name.endswith(".safetensors"):
            from safetensors.torch import save_file

            save_file({"w": torch.zeros(4)}, str(path))
        else:
            torch.save({"x": torch.arange(1000)}, path)


def _complete(root, step, world=2, stage=2):
    tmp = root / f"step-{step}.tmp"
    _write_shards(tmp, world, stage)
    return ckpt.finalize(tmp, step, world, stage)


def test_finalize_seals_publishes_and_points_latest(tmp_path):
    final = _complete(tmp_path, 10)
    assert final == tmp_path / "step-10" and not (tmp_path / "step-10.tmp").exists()
    assert (final / "COMPLETE").is_file()
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["zero_stage"] == 2 and manifest["step"] == 10
    assert "ds/zero_pp_rank_1_mp_rank_00_optim_states.pt" in manifest["files"]
    assert (tmp_path / "latest").read_text().strip() == "step-10"
    assert ckpt.verify(final).ok


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_required_files_per_zero_stage(tmp_path, stage):
    _write_shards(tmp_path, 2, stage)
    assert ckpt.check_files(tmp_path, 2, stage) == []
    names = [a[0] for a in ckpt.required_files(2, stage)]
    assert ("ds/zero_pp_rank_1_mp_rank_00_model_states.pt" in names) == (stage == 3)
    assert ("ds/zero_pp_rank_1_mp_rank_00_optim_states.pt" in names) == (stage >= 1)


def test_bf16_shard_names_are_accepted(tmp_path):
    _write_shards(tmp_path, 2, 2, bf16=True)
    assert ckpt.check_files(tmp_path, 2, 2) == []


def test_a_missing_rank_shard_refuses_to_seal_and_publishes_nothing(tmp_path):
    tmp = tmp_path / "step-5.tmp"
    _write_shards(tmp, 2, 3)
    (tmp / "ds" / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    with pytest.raises(ckpt.CheckpointError, match="zero_pp_rank_1_mp_rank_00_model_states.pt"):
        ckpt.finalize(tmp, 5, 2, 3)
    assert not (tmp_path / "step-5").exists() and not (tmp_path / "latest").exists()
    assert not (tmp / "COMPLETE").exists()


def test_verify_catches_truncation_resize_and_missing_marker(tmp_path):
    final = _complete(tmp_path, 3)
    shard = final / "ds" / "mp_rank_00_model_states.pt"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])  # truncated: size differs from the manifest
    st = ckpt.verify(final)
    assert st.state == "incomplete" and any("mp_rank_00_model_states.pt" in p for p in st.problems)
    # same size but garbage (no zip central directory): caught without unpickling
    shard.write_bytes(b"\0" * len(data))
    assert any("not a readable archive" in p for p in ckpt.verify(final).problems)
    shard.write_bytes(data)
    assert ckpt.verify(final).ok
    (final / "COMPLETE").unlink()
    assert ckpt.verify(final).problems == ("no COMPLETE marker",)


def test_verify_never_unpickles(tmp_path, monkeypatch):
    final = _complete(tmp_path, 3)

    def boom(*_a, **_k):
        raise AssertionError("verification unpickled a file")

    monkeypatch.setattr(pickle, "load", boom)
    monkeypatch.setattr(pickle, "loads", boom)
    monkeypatch.setattr(torch, "load", boom)
    assert ckpt.verify(final).ok


def test_resume_takes_the_newest_complete_and_reports_the_rest(tmp_path):
    _complete(tmp_path, 2)
    _complete(tmp_path, 4)
    (tmp_path / "step-6.tmp").mkdir()  # a save that died
    bad = _complete(tmp_path, 8)
    (bad / "manifest.json").write_text("{not json")
    st, skipped = ckpt.resolve_resume(tmp_path, "latest")
    assert st.step == 4
    assert {(s.step, s.state) for s in skipped} == {(6, "in_progress"), (8, "incomplete")}
    with pytest.raises(ckpt.CheckpointError, match="in_progress"):
        ckpt.resolve_resume(tmp_path, str(tmp_path / "step-6.tmp"))
    assert ckpt.resolve_resume(tmp_path / "nothing", "latest") == (None, [])


def test_prune_keeps_at_least_two_and_removes_abandoned_tmp(tmp_path):
    for s in (1, 2, 3, 4):
        _complete(tmp_path, s)
    (tmp_path / "step-3.tmp").mkdir()
    removed = ckpt.prune(tmp_path, keep=1, current_step=4)  # keep=1 is raised to 2
    assert sorted(p.name for p in removed) == ["step-1", "step-2", "step-3.tmp"]
    assert [s.step for s in ckpt.scan(tmp_path).complete] == [4, 3]
