"""The author's recipe, checked before any process starts: the teacher VAE (missing, corrupt, wrong
latent channels), the teacher latent cache (built, resumed, out of step with the data), the
latent-aligned crops it serves, and the discriminator's pieces. In-process, on real small files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.trainer.conftest import save_tiny_teacher
from tests.trainer.runs import base_config, write_run
from trainer.config import config_from_dict
from trainer.synthetic import make_synthetic


def _cfg(clips: Path, teacher: Path | str = "", cache: Path | str = "", **data):
    raw = base_config(clips, loss={"teacher": str(teacher), "teacher_cache": str(cache)})
    raw["data"].update(data)
    return raw


@pytest.fixture
def clips(tmp_path) -> Path:
    d = tmp_path / "clips"
    make_synthetic(d, clips=3, frames=12, height=64, width=80, seed=3)
    return d


# ------------------------------------------------------------------------------------- teacher


def test_missing_corrupt_and_wrong_channel_teachers_are_named_errors(tmp_path, teacher_dir):
    from trainer.teacher import TeacherError, check_teacher, load_teacher

    with pytest.raises(TeacherError, match="no such directory") as err:
        load_teacher(tmp_path / "nowhere")
    assert str(tmp_path / "nowhere") in str(err.value)

    corrupt = tmp_path / "corrupt"
    shutil.copytree(teacher_dir, corrupt)
    weights = next(corrupt.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:200])  # a download cut short
    with pytest.raises(TeacherError, match="cannot load AutoencoderKLHunyuanVideo") as err:
        load_teacher(corrupt)
    assert str(corrupt) in str(err.value)

    narrow = save_tiny_teacher(tmp_path / "narrow", latent_channels=4)
    with pytest.raises(TeacherError, match="4 latent channels.*16"):
        load_teacher(narrow)
    answer = check_teacher(str(narrow))
    assert answer["ok"] is False and str(narrow) in answer["error"]


def test_a_good_teacher_yields_the_students_latent_shape(teacher_dir):
    from trainer.teacher import check_teacher

    answer = check_teacher(str(teacher_dir))
    assert answer["ok"], answer
    assert answer["latent_shape"] == [2, 16, 2, 2]  # 8 frames, 16x16 -> T/4 x C x H/8 x W/8
    assert answer["identity"]["class"] == "AutoencoderKLHunyuanVideo"


@pytest.mark.parametrize("problem", ["missing", "corrupt", "wrong-channels"])
def test_a_distilling_run_refuses_a_bad_teacher_before_any_process_group(tmp_path, clip_dir, problem, capsys):
    from trainer.train import EXIT_CONFIG, run

    teacher = tmp_path / "teacher"
    if problem == "wrong-channels":
        save_tiny_teacher(teacher, latent_channels=8)
    elif problem == "corrupt":
        save_tiny_teacher(teacher)
        (teacher / "config.json").write_text(
            '{"_class_name": "AutoencoderKLHunyuanVideo", "latent_channels": '
        )
    rd = write_run(tmp_path / "run", _cfg(clip_dir, teacher=teacher))
    assert run(rd) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "loss.teacher" in err and str(teacher) in err
    assert not (rd / "events").exists()  # nothing started: no rank wrote a single event


# ------------------------------------------------------------------------------------- cache


def test_cache_build_is_resumable_and_its_latents_are_the_teachers(tmp_path, clips, teacher_dir):
    from trainer.data import find_videos, read_frames
    from trainer.latent_cache import CachedLatentDataset, build_cache, open_cache, read_manifest, to_canvas
    from trainer.teacher import encode, load_teacher

    cache = tmp_path / "cache"
    cfg = config_from_dict(_cfg(clips, teacher=teacher_dir, cache=cache, height=32, width=32))
    # two "ranks" share the work without talking: the one finishing last writes the manifest
    first = build_cache(cfg, cache, rank=0, world=2, height=64, width=64, max_windows=2, log=lambda _m: None)
    assert first["encoded"] == 2 and first["manifest"] is False
    assert not (cache / "manifest.json").exists()
    second = build_cache(cfg, cache, rank=1, world=2, height=64, width=64, max_windows=2, log=lambda _m: None)
    assert second["encoded"] == 1 and second["manifest"] is True
    again = build_cache(cfg, cache, rank=0, world=1, height=64, width=64, max_windows=2, log=lambda _m: None)
    assert again == {"encoded": 0, "kept": 3, "manifest": True}  # resumed: nothing encoded twice

    manifest = open_cache(cache, cfg)
    assert manifest == read_manifest(cache)
    assert all(c["windows"] == 1 for c in manifest["clips"])  # 12 frames: one 8-frame window each

    # a latent-aligned 32x32 crop of the cache is exactly the slice of the teacher's canvas encode
    ds = CachedLatentDataset(cache, manifest, find_videos(str(clips)), cfg.data)
    item = ds[(0, 11)]
    assert item["video"].shape == (8, 3, 32, 32) and item["video"].dtype == torch.uint8
    assert item["latents"].shape == (2, 16, 4, 4)
    canvas = to_canvas(read_frames(Path(ds.clips[0]["path"]), list(range(8))), 64, 64)
    lat = encode(load_teacher(teacher_dir), canvas[None].float() / 255)[0]
    hits = [
        (t, l)
        for t in range(0, 33, 8)
        for l in range(0, 33, 8)
        if torch.equal(canvas[:, :, t : t + 32, l : l + 32], item["video"])
    ]
    assert hits, "the crop is not on the 8-pixel latent grid"
    t, l = hits[0]
    expect = lat[:, :, t // 8 : t // 8 + 4, l // 8 : l // 8 + 4]
    torch.testing.assert_close(item["latents"], expect.half().float())


@pytest.mark.parametrize("change", ["added", "removed", "changed"])
def test_a_cache_out_of_step_with_the_data_is_refused_then_rebuilt(
    tmp_path, clips, teacher_dir, change, capsys
):
    from trainer.latent_cache import CacheError, build_cache, open_cache
    from trainer.train import EXIT_CONFIG, run

    cache = tmp_path / "cache"
    raw = _cfg(clips, cache=cache)
    cfg = config_from_dict(_cfg(clips, teacher=teacher_dir, cache=cache))
    build_cache(cfg, cache, log=lambda _m: None)
    victim = min(clips.glob("*.mp4"))
    if change == "added":
        make_synthetic(tmp_path / "more", clips=1, frames=12, height=64, width=80, seed=9)
        victim = clips / "extra.mp4"
        shutil.copy(next((tmp_path / "more").glob("*.mp4")), victim)
    elif change == "removed":
        victim.unlink()
    else:
        make_synthetic(tmp_path / "other", clips=1, frames=16, height=64, width=80, seed=5)
        shutil.copy(next((tmp_path / "other").glob("*.mp4")), victim)
    with pytest.raises(CacheError, match=f"{change} {victim}"):
        open_cache(cache, cfg)
    # the trainer refuses the same way, before any process group, without the teacher present
    rd = write_run(tmp_path / "run", raw)
    assert run(rd) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"{change} {victim}" in err and "cache-latents" in err
    assert not (rd / "events").exists()
    # cache-latents brings it up to date, re-encoding only the clip that changed
    result = build_cache(cfg, cache, log=lambda _m: None)
    assert result["encoded"] == (0 if change == "removed" else 1) and result["manifest"]
    open_cache(cache, cfg)
    assert len(list((cache / "clips").glob("*.safetensors"))) == len(list(clips.glob("*.mp4")))


def test_a_cache_for_other_windows_or_another_teacher_is_refused(tmp_path, clips, teacher_dir):
    from trainer.latent_cache import CacheError, build_cache, open_cache

    cache = tmp_path / "cache"
    cfg = config_from_dict(_cfg(clips, teacher=teacher_dir, cache=cache))
    build_cache(cfg, cache, log=lambda _m: None)
    with pytest.raises(CacheError, match="windows are 8 frames, data.frames is 12"):
        open_cache(cache, config_from_dict(_cfg(clips, cache=cache, frames=12)))
    with pytest.raises(CacheError, match="smaller than the training crop"):
        open_cache(cache, config_from_dict(_cfg(clips, cache=cache, height=72)))
    other = save_tiny_teacher(tmp_path / "other-teacher", seed=1)
    (other / "config.json").write_text((other / "config.json").read_text().replace("0.476986", "0.5"))
    with pytest.raises(CacheError, match="another teacher"):
        open_cache(cache, config_from_dict(_cfg(clips, teacher=other, cache=cache)))
    # a cache needs no teacher once written: a teacher directory that is gone is not an error
    open_cache(cache, config_from_dict(_cfg(clips, teacher=tmp_path / "deleted", cache=cache)))
    (cache / "manifest.json").unlink()
    with pytest.raises(CacheError, match="cache-latents"):
        open_cache(cache, cfg)


def test_cache_latents_command_reports_bad_input(tmp_path, clips, capsys):
    from trainer.cli import main

    rd = write_run(tmp_path / "run", _cfg(clips, teacher=tmp_path / "no-teacher", cache=tmp_path / "cache"))
    assert main(["cache-latents", "--run", str(rd)]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert not (tmp_path / "cache" / "manifest.json").exists()


# ------------------------------------------------------------------------------------- discriminator


def test_frame_groups_pair_three_frames_with_the_latents_they_decode_from():
    from trainer.discriminator import frame_groups

    video = torch.arange(9, dtype=torch.float32).view(1, 9, 1, 1, 1).expand(1, 9, 3, 8, 8)
    latents = torch.arange(3, dtype=torch.float32).view(1, 3, 1, 1, 1).expand(1, 3, 16, 1, 1)
    frames, cond = frame_groups(video, latents)
    assert frames.shape == (3, 9, 8, 8) and cond.shape == (3, 16, 1, 1)
    # frames 0,1,2 come from latents 0,1,1; 3,4,5 from 1,2,2 (frame t from latent ceil(t/4)) ...
    assert cond[:, 0, 0, 0].tolist() == [0.5, 1.5, 2.0]
    assert frames[1, ::3, 0, 0].tolist() == [3.0, 4.0, 5.0]


def test_discriminator_learns_and_its_checkpoint_round_trips(tmp_path):
    from safetensors.torch import load_file

    from trainer.config import AdversarialSection
    from trainer.discriminator import Adversary, state_digest

    torch.manual_seed(0)
    adv = Adversary(AdversarialSection(weight=0.1, width=8, replay=4), 16, "cpu", seed=1)
    real = torch.rand(2, 5, 3, 16, 16)
    fake = torch.full_like(real, 0.5)
    lat = torch.randn(2, 2, 16, 2, 2)
    losses = [adv.discriminator_step(fake, real, lat) for _ in range(15)]
    assert losses[-1] < losses[0]
    assert len(adv.replay) == 4
    adv.opt.zero_grad(set_to_none=True)
    g = fake.clone().requires_grad_(True)
    adv.generator_loss(g, real, lat).backward()
    assert g.grad.abs().sum() > 0  # the decoder gets a correction
    assert all(p.grad is None for p in adv.net.parameters())  # the generator's term never trains D
    (tmp_path / "trainer").mkdir()
    adv.save(tmp_path)
    fresh = Adversary(AdversarialSection(weight=0.1, width=8), 16, "cpu", seed=2)
    assert fresh.digest() != adv.digest()
    fresh.load(tmp_path)
    assert (
        fresh.digest()
        == adv.digest()
        == state_digest(load_file(str(tmp_path / "trainer/discriminator.safetensors")))
    )
    assert fresh.optimizer_steps() == 15


def test_adversarial_term_needs_frames_for_its_groups():
    from trainer.config import ConfigError

    with pytest.raises(ConfigError, match="data.frames >= 8"):
        config_from_dict({"data": {"frames": 4}, "adversarial": {"weight": 0.1}})
    assert config_from_dict({"data": {"frames": 4}}).adversarial.weight == 0  # off by default
