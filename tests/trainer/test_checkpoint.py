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
    # `latest` still names the bad step-8: reported, not followed
    assert {(s.step, s.state) for s in skipped} == {(6, "in_progress"), (8, "incomplete"), (-1, "invalid")}
    assert "names step-8, but step-4 is the newest that verifies" in skipped[-1].problems[0]
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


def _flip_one_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_same_size_corruption_is_caught_by_the_hashes(tmp_path):
    final = _complete(tmp_path, 2)
    manifest = json.loads((final / "manifest.json").read_text())
    assert set(manifest["hashes"]) == set(manifest["files"])
    assert all(h.startswith("xxh3_128:") for h in manifest["hashes"].values())
    shard = final / "ds" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    size = shard.stat().st_size
    _flip_one_byte(shard)
    assert shard.stat().st_size == size
    assert ckpt.verify(final).ok  # sizes and zip directory cannot see it ...
    st = ckpt.verify(final, hashes=True)  # ... the hash does
    assert not st.ok and "zero_pp_rank_1_mp_rank_00_optim_states.pt: contents differ" in st.problems[0]


def test_resume_skips_a_corrupted_newest_for_the_one_before(tmp_path):
    _complete(tmp_path, 2)
    newest = _complete(tmp_path, 4)
    _flip_one_byte(newest / ckpt.WEIGHTS)
    st, skipped = ckpt.resolve_resume(tmp_path, "latest")
    assert st.step == 2
    assert any(s.step == 4 and "contents differ" in s.problems[0] for s in skipped)
    with pytest.raises(ckpt.CheckpointError, match="contents differ"):
        ckpt.resolve_resume(tmp_path, str(newest))


def test_manifests_from_before_hashes_still_verify(tmp_path):
    final = _complete(tmp_path, 2)
    manifest = json.loads((final / "manifest.json").read_text())
    del manifest["hashes"]
    (final / "manifest.json").write_text(json.dumps(manifest))
    assert ckpt.verify(final, hashes=True).ok


@pytest.mark.parametrize(
    "content, words",
    [
        (b"\xff\xfe\x00\x81garbage\x00", "not text (12 bytes of binary data)"),
        (b"../../etc/passwd\n", "not a checkpoint name"),
        (b"step-4 and more\n", "not a checkpoint name"),
    ],
    ids=["binary", "path", "text"],
)
def test_garbage_in_latest_is_reported_and_resume_uses_the_checkpoints(tmp_path, content, words):
    _complete(tmp_path, 2)
    _complete(tmp_path, 4)
    (tmp_path / "latest").write_bytes(content)
    assert ckpt.read_latest(tmp_path)[0] is None and words in ckpt.read_latest(tmp_path)[1]
    st, skipped = ckpt.resolve_resume(tmp_path, "latest")
    assert st.step == 4 and words in skipped[-1].problems[0]


def test_prune_never_removes_what_latest_names_or_the_resume_source(tmp_path):
    for s in (1, 2, 3, 4, 5):
        _complete(tmp_path, s)
    ckpt.write_latest(tmp_path, "step-2")
    removed = ckpt.prune(tmp_path, keep=2, current_step=5, protect=(tmp_path / "step-1",))
    assert sorted(p.name for p in removed) == ["step-3"]
    assert [s.step for s in ckpt.scan(tmp_path).complete] == [5, 4, 2, 1]


def test_abandon_newer_moves_the_old_timeline_aside(tmp_path):
    for s in (2, 4, 6):
        _complete(tmp_path, s)
    (tmp_path / "step-8.tmp").mkdir()
    dest = ckpt.abandon_newer(tmp_path, 2)
    assert sorted(p.name for p in dest.iterdir()) == ["step-4", "step-6", "step-8.tmp"]
    assert dest.parent == tmp_path / "abandoned" and dest.name.endswith("-at-step-2")
    assert [s.step for s in ckpt.scan(tmp_path).complete] == [2] and ckpt.scan(tmp_path).skipped == []
    assert ckpt.abandon_newer(tmp_path, 2) is None
