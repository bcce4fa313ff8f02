"""Shipped presets load and say what FACTS.md says; bad preset files fail naming the file and key."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from taehv_console.core.plan.footprint import parameter_count
from taehv_console.core.plan.presets import (
    list_presets,
    load_preset,
    parse_override,
    shipped_preset_dir,
    user_preset_dir,
)
from taehv_console.core.plan.zero import sized_bucket
from trainer.config import ConfigError

SHIPPED = ["1gpu-h100", "8gpu-h100", "16gpu-h100", "48gpu-h100", "64gpu-h100", "8gpu-a800", "cpu-smoke"]


@pytest.fixture
def no_user_dir(monkeypatch, tmp_path):
    # the developer's own ~/.config presets must not leak into the tests
    monkeypatch.setenv("TAEHV_CONSOLE_PRESETS", str(tmp_path / "no-user-presets"))


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_every_shipped_preset_loads(no_user_dir):
    listing = list_presets()
    assert listing.errors == ()
    assert sorted(p.name for p in listing.presets) == sorted(SHIPPED)
    assert all(p.source == "shipped" and p.meta.description for p in listing.presets)
    # the package data really is where the loader looks (pyproject ships presets/*.toml)
    assert {p.stem for p in shipped_preset_dir().glob("*.toml")} == set(SHIPPED)


# name: (nodes, gpus/node, batch/GPU, accum, effective, LR, warmup, ZeRO, checkpoint every, timeout)
PUBLIC = {
    "8gpu-h100": (1, 8, 8, 2, 128, 1e-4, 2000, 2, 2000, 3600),
    "16gpu-h100": (2, 8, 8, 1, 128, 1e-4, 1500, 3, 1000, 7200),
    "48gpu-h100": (6, 8, 5, 1, 240, 1.8e-4, 1200, 3, 750, 10800),
    "64gpu-h100": (8, 8, 4, 1, 256, 2e-4, 1000, 3, 500, 14400),
    # resolved on purpose (see the files): 1 GPU keeps the LR rule at 128, A800 warmup 200 -> 2000
    "1gpu-h100": (1, 1, 4, 32, 128, 1e-4, 2000, 2, 500, 3600),
    "8gpu-a800": (1, 8, 2, 8, 128, 1e-4, 2000, 2, 1000, 3600),
}


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_shipped_values_follow_the_public_table(name, no_user_dir):
    c = load_preset(name).config
    got = (
        c.topology.nodes,
        c.topology.gpus_per_node,
        c.optim.batch_per_gpu,
        c.optim.grad_accum,
        c.effective_batch,
        c.optim.lr,
        c.optim.warmup_steps,
        c.deepspeed.zero_stage,
        c.schedule.checkpoint_every,
        c.distributed.collective_timeout_s,
    )
    assert got == PUBLIC[name]
    # common to all GPU presets: frames as stated read as 480 high x 720 wide, AdamW, bf16, 100k steps
    assert (c.data.height, c.data.width) == (480, 720)
    assert c.optim.betas == (0.9, 0.95) and c.optim.weight_decay == 0.01 and c.optim.grad_clip == 1.0
    assert (
        c.deepspeed.mixed_precision == "bf16"
        and c.optim.schedule == "cosine"
        and c.optim.max_steps == 100_000
    )
    assert c.data.frames == (20 if name == "1gpu-h100" else 12)
    assert c.run.preset == name
    # execution settings, not the recipe: NHWC and torch.compile on every GPU preset
    assert c.model.channels_last and c.model.compile


def test_cpu_smoke_runs_eager_in_nchw(no_user_dir):
    m = load_preset("cpu-smoke").config.model
    assert not m.channels_last and not m.compile  # a smoke run must not wait for a compile


def test_bucket_and_stage3_values_reach_the_config(no_user_dir):
    # buckets sized for the 11,315,539-element gradient (not the public 5e8-1e9): one bucket of 2e7
    # on one node, overlap off; 4 buckets of 3e6 across nodes, overlap on (core/plan/zero.py)
    buckets = {
        "1gpu-h100": (2e7, False),
        "8gpu-h100": (2e7, False),
        "8gpu-a800": (2e7, False),
        "cpu-smoke": (2e7, False),
        "16gpu-h100": (3e6, True),
        "48gpu-h100": (3e6, True),
        "64gpu-h100": (3e6, True),
    }
    for name, (size, overlap) in buckets.items():
        c = load_preset(name).config
        ds = c.deepspeed
        assert ds.reduce_bucket_size == ds.allgather_bucket_size == size and ds.overlap_comm is overlap, name
        assert ds.reduce_bucket_size == sized_bucket(parameter_count(c.model).total, c.topology.nodes), name
    stage3 = {"16gpu-h100": (1e9, 2e8), "48gpu-h100": (8e8, 2.5e8), "64gpu-h100": (5e8, 3e8)}
    for name, (live, prefetch) in stage3.items():
        ds = load_preset(name).config.deepspeed
        assert (ds.stage3_max_live_parameters, ds.stage3_prefetch_bucket_size) == (live, prefetch)
        assert ds.stage3_param_persistence_threshold == 100_000


def test_cpu_smoke_checkpoints_and_validates_within_its_run(no_user_dir):
    c = load_preset("cpu-smoke").config
    assert c.topology.device == "cpu" and (c.topology.nodes, c.topology.gpus_per_node) == (1, 2)
    assert (c.data.frames, c.data.height, c.data.width) == (8, 64, 64) and c.data.source == ""
    assert c.data.num_workers <= 1 and c.deepspeed.zero_stage == 2
    assert 20 <= c.optim.max_steps <= 60
    # more than keep_checkpoints checkpoints in the run, so pruning is exercised as well
    assert c.optim.max_steps // c.schedule.checkpoint_every > c.schedule.keep_checkpoints
    assert c.schedule.val_every < c.optim.max_steps


@pytest.mark.parametrize(
    "body, key, words",
    [
        ("[optim]\nlearning_rate = 1e-4\n", "optim.learning_rate", "unknown key"),
        ("[optim]\nbatch_per_gpu = 'eight'\n", "optim.batch_per_gpu", "integer"),
        ("[optim]\nbatch_per_gpu = 0\n", "optim.batch_per_gpu", "greater than or equal to 1"),
        ("[optim]\nlr = -1e-4\n", "optim.lr", "greater than 0"),
        ("[data]\nframes = 13\n", "data.frames", "multiple of 4"),
        ("[deepspeed]\nzero_stage = 4\n", "deepspeed.zero_stage", "0, 1, 2 or 3"),
        ("[topology]\ngpus_per_node = 0\n", "topology.gpus_per_node", "greater than or equal to 1"),
        ("[optimizer]\nlr = 1e-4\n", "optimizer", "unknown key"),
        ("[preset]\ndescription = 'x'\nowner = 'me'\n", "preset.owner", "unknown key"),
    ],
)
def test_malformed_preset_names_file_and_key(tmp_path, body, key, words):
    path = write(tmp_path / "bad.toml", body)
    with pytest.raises(ConfigError) as err:
        load_preset(str(path), user_dir=None)
    text = str(err.value)
    assert str(path) in text
    assert f"  {key}:" in text
    assert words in text


def test_not_toml_and_missing_file(tmp_path):
    path = write(tmp_path / "broken.toml", "[optim\nlr = 1\n")
    with pytest.raises(ConfigError, match="broken.toml: not valid TOML"):
        load_preset(str(path), user_dir=None)
    with pytest.raises(ConfigError, match="no such preset file"):
        load_preset(str(tmp_path / "absent.toml"), user_dir=None)
    with pytest.raises(ConfigError, match="no preset named 'nope'.*8gpu-h100"):
        load_preset("nope", user_dir=None)


def test_user_presets_shadow_shipped_and_inherit_with_base(tmp_path, monkeypatch):
    udir = tmp_path / "presets"
    udir.mkdir()
    monkeypatch.setenv("TAEHV_CONSOLE_PRESETS", str(udir))
    write(
        udir / "my-cluster.toml",
        """
        [preset]
        description = "our 8-GPU box with our data"
        base = "8gpu-h100"
        [data]
        source = "/data/videos"
        [optim]
        max_steps = 5000
        """,
    )
    write(udir / "8gpu-h100.toml", '[preset]\nbase = "16gpu-h100"\n[topology]\nnodes = 1\n')
    p = load_preset("my-cluster")
    assert p.source == "user" and p.config.data.source == "/data/videos"
    # its base is the *user's* 8gpu-h100, which itself builds on the shipped 16gpu-h100
    assert p.config.optim.max_steps == 5000 and p.config.deepspeed.zero_stage == 3
    assert p.config.topology.nodes == 1 and p.config.topology.gpus_per_node == 8
    assert load_preset("8gpu-h100").source == "user"
    # the GPU model and network advice come along with the values they describe
    assert (p.meta.gpu, p.meta.network) == ("H100", "10Gbit")
    assert user_preset_dir() == udir


def test_base_cycle_is_an_error(tmp_path):
    write(tmp_path / "a.toml", '[preset]\nbase = "b"\n')
    write(tmp_path / "b.toml", '[preset]\nbase = "a"\n')
    with pytest.raises(ConfigError, match="cycle"):
        load_preset("a", user_dir=tmp_path)


def test_a_broken_user_preset_is_listed_as_an_error_not_a_crash(tmp_path):
    write(tmp_path / "typo.toml", "[optim]\nbatch = 3\n")
    listing = list_presets(user_dir=tmp_path)
    assert len(listing.presets) == len(SHIPPED)
    assert (
        len(listing.errors) == 1 and "typo.toml" in listing.errors[0] and "optim.batch" in listing.errors[0]
    )


def test_overrides_parse_as_toml_and_are_validated(no_user_dir):
    assert parse_override("optim.lr=2e-4") == (["optim", "lr"], 2e-4)
    assert parse_override("optim.betas=[0.9, 0.99]") == (["optim", "betas"], [0.9, 0.99])
    # not TOML: taken as a string, so paths need no quoting on the command line
    assert parse_override("data.source=/data/my videos") == (["data", "source"], "/data/my videos")
    p = load_preset("8gpu-h100", overrides=["optim.lr=2e-4", "data.source=/d", "deepspeed.zero_stage=3"])
    assert (p.config.optim.lr, p.config.data.source, p.config.deepspeed.zero_stage) == (2e-4, "/d", 3)
    assert p.explicit["deepspeed"]["zero_stage"] == 3


@pytest.mark.parametrize(
    "override, key, words",
    [
        ("optim.lr=-1", "optim.lr", "greater than 0"),
        ("optim.lrr=1e-4", "optim.lrr", "unknown key"),
        ("data.frames=10", "data.frames", "multiple of 4"),
        ("deepspeed.zero_stage=4", "deepspeed.zero_stage", "0, 1, 2 or 3"),
    ],
)
def test_bad_override_names_the_key(override, key, words, no_user_dir):
    with pytest.raises(ConfigError) as err:
        load_preset("8gpu-h100", overrides=[override])
    text = str(err.value)
    assert text.startswith("--set ") and f"  {key}:" in text and words in text and "8gpu-h100" in text


def test_override_without_section_is_refused():
    with pytest.raises(ConfigError, match="section.key"):
        parse_override("lr=1e-4")
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("optim.lr")
