"""channels_last and torch.compile under DeepSpeed: real 2-process runs of the trainer (accelerate,
gloo) give the same losses as the plain model, ZeRO-2 and ZeRO-3. channels_last used to crash in
deepspeed.initialize (DeepSpeed views each parameter as flat bytes; NHWC weights cannot be)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import tomllib

from tests.trainer.runs import base_config, events, run_to_end, write_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _run(tmp_path_factory, clip_dir, name: str, zero: int, env: dict | None = None, **model):
    cfg = base_config(
        clip_dir,
        model=model,
        # a gentle LR: at 2e-3 without warmup the second step's loss jumps 10000x and amplifies the
        # layouts' rounding differences past any useful tolerance (seen: 0.42065 vs 0.42018 after it)
        optim={"grad_accum": 1, "max_steps": 3, "warmup_steps": 0, "lr": 2e-4},
        deepspeed={"zero_stage": zero},
        schedule={"val_every": 100, "checkpoint_every": 100},
    )
    run = write_run(tmp_path_factory.mktemp(name) / "run", cfg)
    run_to_end(run, 2, env=env)
    steps = events(run, 0, "step")
    assert [e["step"] for e in steps] == [1, 2, 3]
    return run, [e["loss"] for e in steps]


def _losses(tmp_path_factory, clip_dir, name: str, zero: int, **model) -> list[float]:
    return _run(tmp_path_factory, clip_dir, name, zero, **model)[1]


@pytest.fixture(scope="module")
def plain(tmp_path_factory, clip_dir) -> dict[int, list[float]]:
    return {z: _losses(tmp_path_factory, clip_dir, f"plain{z}", z) for z in (2, 3)}


@pytest.mark.parametrize("zero", [2, 3])
def test_channels_last_trains_like_the_plain_model(tmp_path_factory, clip_dir, plain, zero):
    got = _losses(tmp_path_factory, clip_dir, f"cl{zero}", zero, channels_last=True)
    # the same data, init and updates: only the summation order inside the convolutions differs
    assert got == pytest.approx(plain[zero], rel=2e-3), (got, plain[zero])
    assert got[-1] != plain[zero][0]  # the weights did move, so later steps compare updated models


def _seed_kernel_binaries(first: Path, fresh: Path) -> int:
    """Copy the first run's compiled C++ kernels (Inductor's `<2 chars>/<key>.main.so`, keyed by
    their source and compile command) into the fresh machine's Inductor directory, and nothing else:
    no FX graph and no AOTAutograd entry (`fxgraph/`, `aotautograd/`), so every graph must still come
    from the run's cache, which is what the resume below asserts. On a GPU the run's cache carries
    the Triton kernels themselves; on CPU the resume would otherwise rebuild each C++ kernel with g++
    (~60 CPU-s of this test alone on the 2-core machine), which tests g++, not the run's cache."""
    copied = 0
    for so in first.glob("??/*.so"):
        target = fresh / so.relative_to(first)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(so, target)
        copied += 1
    assert not (fresh / "fxgraph").exists() and not (fresh / "aotautograd").exists()
    return copied


def test_compile_trains_like_the_plain_model_under_zero2_and_a_fresh_machine_compiles_from_the_run(
    tmp_path_factory, clip_dir, plain
):
    # Inductor's own cache in a directory of this test's: the resume below, on an empty one, stands
    # for a restarted pod or a spare node, whose /tmp never saw this model
    inductor = tmp_path_factory.mktemp("inductor")
    env = {"TORCHINDUCTOR_CACHE_DIR": str(inductor / "first")}
    run, got = _run(tmp_path_factory, clip_dir, "compiled", 2, env=env, compile=True, channels_last=True)
    assert got == pytest.approx(plain[2], rel=2e-3), (got, plain[2])
    first = {r: events(run, r, "compile") for r in (0, 1)}
    assert [len(first[r]) for r in (0, 1)] == [1, 1], first
    # no run cache yet: the stages compiled, and rank 0 wrote a part of it after the first step.
    # Both ranks compile the same graphs into the one Inductor directory at the same time, so a
    # rank that falls behind can find a graph its peer has just written (seen in CI: rank 0 hit 1),
    # so each rank's graphs are counted whether compiled or found, and nothing came from the run's cache
    cache = first[0][0]["cache"]
    for r in (0, 1):
        c = first[r][0]["cache"]
        assert c["loaded"] == 0 and c["hits"] + c["misses"] > 0 and c["error"] is None, (r, c)
        assert c["aot_bypasses"] == 0, (r, c)  # every stage kept by AOTAutograd's cache
    assert cache["saved"] > 0 and first[1][0]["cache"]["saved"] == 0, first
    folder = Path(cache["folder"])
    parts = sorted(p.name for p in folder.iterdir())
    # one part after the first step, one after the validation (its no-grad graphs)
    assert folder.parent == run / "compile-cache" and parts == ["part-1.bin", "part-2.bin"], parts

    cfg = tomllib.loads((run / "run.toml").read_text())
    cfg["optim"]["max_steps"] = 4
    write_run(run, cfg)
    fresh = inductor / "fresh"
    assert _seed_kernel_binaries(inductor / "first", fresh) > 0
    run_to_end(run, 2, ("--resume", "latest"), env={"TORCHINDUCTOR_CACHE_DIR": str(fresh)})
    for r in (0, 1):
        again = events(run, r, "compile")[-1]
        assert again["step"] == 4, again
        c = again["cache"]
        # every graph from the run's cache, nothing compiled, and so no part written again
        assert c["loaded"] >= cache["saved"] and c["hits"] > 0 and c["misses"] == 0, c
        # and no stage traced again: AOTAutograd's cache keeps the stages' custom autograd functions
        assert c["aot_hits"] > 0 and c["aot_bypasses"] == 0, c
        assert c["saved"] == 0 and c["error"] is None, c
    assert sorted(p.name for p in folder.iterdir()) == parts
