"""JIT extension builds (DeepSpeed's CPU shm_comm op), which a launch waits for before its first step.

- A killed build leaves torch's build `lock` behind; every later launch would wait on it forever.
  The trainer removes such a lock once it is old enough to belong to no build, and leaves a fresh
  one (a build in progress) alone.
- Every launch builds with the same ninja, its environment's: a build log written by another ninja
  version looks changed, and the op was rebuilt (a minute of every core) whenever a launch's PATH
  found another ninja than the last launch's."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from trainer.runtime import STALE_BUILD_LOCK_S, clear_stale_build_locks, prefer_this_environments_ninja


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


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_the_environments_own_ninja_goes_first_on_path(tmp_path):
    system = _executable(tmp_path / "usr" / "bin" / "ninja")
    own = _executable(tmp_path / "venv" / "bin" / "ninja")
    python = str(tmp_path / "venv" / "bin" / "python")
    env = {"PATH": str(system.parent)}
    assert shutil.which("ninja", path=env["PATH"]) == str(system)
    assert prefer_this_environments_ninja(python, env)
    assert shutil.which("ninja", path=env["PATH"]) == str(own)
    assert env["PATH"].endswith(os.pathsep + str(system.parent))  # the rest of PATH is kept
    before = env["PATH"]
    assert not prefer_this_environments_ninja(python, env) and env["PATH"] == before  # once only
    # an environment without a ninja of its own leaves PATH as it is
    env = {"PATH": str(system.parent)}
    assert not prefer_this_environments_ninja(str(tmp_path / "bare" / "bin" / "python"), env)
    assert env == {"PATH": str(system.parent)}


def test_this_projects_environment_builds_with_its_own_ninja():
    # `make install` puts pip's ninja in the venv; a shell's PATH without the venv finds another
    own = Path(sys.executable).parent / "ninja"
    assert own.is_file(), "the test environment has no ninja of its own (Makefile: make install)"
    env = {"PATH": "/usr/bin:/bin"}
    prefer_this_environments_ninja(sys.executable, env)
    assert shutil.which("ninja", path=env["PATH"]) == str(own)
