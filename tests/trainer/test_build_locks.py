"""A killed JIT extension build (DeepSpeed's CPU shm_comm op) leaves torch's build `lock` behind;
every later launch would wait on it forever. The trainer removes such a lock once it is old enough
to belong to no build, and leaves a fresh one (a build in progress) alone."""

from __future__ import annotations

import os
import time

from trainer.runtime import STALE_BUILD_LOCK_S, clear_stale_build_locks


def _lock(path, age_s: float):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    t = time.time() - age_s
    os.utime(path, (t, t))
    return path


def test_a_stale_build_lock_is_removed_and_a_fresh_one_kept(tmp_path):
    # ~/.cache/torch_extensions/<python>_<cpu|cuXXX>/<extension>/lock, as torch lays it out
    stale = _lock(tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock", STALE_BUILD_LOCK_S + 60)
    fresh = _lock(tmp_path / "py311_cpu" / "fused_adam" / "lock", 30)
    # $TORCH_EXTENSIONS_DIR/<extension>/lock
    flat = _lock(tmp_path / "cpu_adam" / "lock", STALE_BUILD_LOCK_S * 2)
    removed = clear_stale_build_locks(tmp_path)
    assert sorted(removed) == sorted([stale, flat])
    assert not stale.exists() and not flat.exists() and fresh.exists()
    assert clear_stale_build_locks(tmp_path) == []
    assert clear_stale_build_locks(tmp_path / "never-built") == []


def test_the_build_root_follows_torch_extensions_dir(tmp_path, monkeypatch):
    stale = _lock(tmp_path / "ext" / "lock", STALE_BUILD_LOCK_S + 1)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert clear_stale_build_locks() == [stale]
