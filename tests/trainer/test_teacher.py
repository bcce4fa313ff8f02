"""Distillation to a teacher VAE (HunyuanVideo's AutoencoderKLHunyuanVideo) loaded from a local
diffusers directory: a small randomly initialised one that the test saves itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib
import torch

from tests.trainer.runs import Launch, base_config, events, write_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_teacher_latents_align_with_taehv_latents(teacher_dir):
    """T = 4k frames: TAEHV gives k latents; the teacher, given frames [0, 4k−3), gives k as well
    (its causal first latent is frame 0 alone) — latent j of each stands for the same frames."""
    from diffusers import AutoencoderKLHunyuanVideo

    from trainer.model import TAEHV

    teacher = AutoencoderKLHunyuanVideo.from_pretrained(teacher_dir).eval()
    model = TAEHV().eval()
    x = torch.rand(1, 8, 3, 32, 32)
    with torch.no_grad():
        z = model.encode(x)
        t = teacher.encode(
            x[:, : 8 - model.frames_to_trim].mul(2).sub(1).permute(0, 2, 1, 3, 4)
        ).latent_dist.mode()
        y = model.decode(t.permute(0, 2, 1, 3, 4))
    assert t.permute(0, 2, 1, 3, 4).shape == z.shape
    assert y.shape[1] == 8 - model.frames_to_trim  # decoding teacher latents gives the aligned frames


def test_each_familys_teacher_sees_the_frames_its_student_encodes():
    """Which input frames the teacher encodes for a T-frame clip, per family: a 1 + 4k causal VAE the
    first T - 3 (k latents, as the student's T = 4k), LTX's 1 + 8k the first T - 7, H3's chunked one
    all T = 17n (it chunks and drops as the student does: 5n - 3 latents)."""
    from trainer.families import teacher_frames
    from trainer.teacher import student_latent_frames

    assert [teacher_frames(f, 12) for f in ("taehv", "taew2_1", "taew2_2", "taehv1_5", "taecvx")] == [9] * 5
    assert (teacher_frames("taeltx_2", 16), student_latent_frames("taeltx_2", 16)) == (9, 2)  # 1 + 8k
    assert (teacher_frames("taeh3", 34), student_latent_frames("taeh3", 34)) == (34, 7)  # 5·2 - 3
    assert (teacher_frames("custom", 16, time_scale=8), student_latent_frames("taew2_1", 12)) == (9, 3)


def test_taew2_1_distils_from_the_wan_vae_and_a_teacher_of_another_family_says_which_fits(
    wan_dir, teacher_dir
):
    """The class comes from config.json: a Wan VAE loads as AutoencoderKLWan, its latents of the first
    T - 3 frames line up with taew2_1's; given to a run of another family it is an error naming taew2_1,
    and HunyuanVideo's VAE given to taew2_1 names taehv."""
    from trainer.model import TAEHV
    from trainer.teacher import TeacherError, check_teacher, encode, load_teacher

    teacher = load_teacher(wan_dir, family="taew2_1")
    assert type(teacher).__name__ == "AutoencoderKLWan"
    x = torch.rand(1, 12, 3, 32, 32)
    with torch.no_grad():
        assert (
            encode(teacher, x, "taew2_1").shape
            == TAEHV.for_family("taew2_1").encode(x).shape
            == (1, 3, 16, 4, 4)
        )
    with pytest.raises(
        TeacherError,
        match=r"the teacher is AutoencoderKLWan with 16 latent.*family = taehv.*fits model.family = taew2_1",
    ):
        load_teacher(wan_dir, family="taehv")
    with pytest.raises(
        TeacherError, match="family = taew2_2 needs AutoencoderKLWan, 48 latent channels, 16x space"
    ):
        load_teacher(wan_dir, latent_channels=48, family="taew2_2")
    answer = check_teacher(str(teacher_dir), family="taew2_1")
    assert not answer["ok"] and "fits model.family = taehv" in answer["error"]
    assert check_teacher(str(wan_dir), family="taew2_1")["identity"]["class"] == "AutoencoderKLWan"


def test_a_teacher_that_cannot_be_loaded_is_an_error_not_a_substitute(tmp_path, clip_dir):
    bad = tmp_path / "not-a-teacher"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    run = write_run(
        tmp_path / "run", base_config(clip_dir, topology={"gpus_per_node": 1}, loss={"teacher": str(bad)})
    )
    launch = Launch(run, 1)
    assert launch.wait() != 0
    log = launch.log.read_text()
    assert "loss.teacher" in log and str(bad) in log
    assert not events(run, 0, "step")


# ------------------------------------------------------------------ the recipe on 2 processes


def _run_to_end(run, nprocs: int, args: tuple[str, ...] = ()) -> Launch:
    # these runs load diffusers and a teacher on every rank: on a shared 2-core machine a launch can
    # take minutes, so they wait longer than runs.py's default before calling it hung
    launch = Launch(run, nprocs, args)
    rc = launch.wait(timeout=900)
    assert rc == 0, f"launcher exited {rc}:\n{launch.tail()}"
    return launch


def _distill_config(clip_dir, stage: int, **loss):
    return base_config(
        clip_dir,
        deepspeed={"zero_stage": stage},
        optim={"max_steps": 8, "lr": 3e-3, "warmup_steps": 1},
        loss={"decoder_on_teacher_latents": True, **loss},
        schedule={"checkpoint_every": 100, "val_every": 100, "log_every": 1},
    )


def _falls(values: list[float]) -> bool:
    head, tail = values[:2], values[-2:]
    return sum(tail) / len(tail) < 0.8 * sum(head) / len(head)


# The online recipe's scenario: every term at once, the adversarial one too (a small discriminator),
# checkpointed at step 4 and at the end (8)
ADVERSARIAL = {"weight": 0.1, "width": 8, "replay": 4}
ONLINE_STEPS, ONLINE_CHECKPOINT_EVERY = 8, 4


def _online_config(clip_dir, teacher_dir, stage: int) -> dict:
    raw = _distill_config(clip_dir, stage, teacher=str(teacher_dir))
    raw["optim"]["max_steps"] = ONLINE_STEPS
    raw["schedule"]["checkpoint_every"] = ONLINE_CHECKPOINT_EVERY
    raw["adversarial"] = dict(ADVERSARIAL)
    return raw


@pytest.fixture(scope="module")
def online_runs(teacher_dir, clip_dir, tmp_path_factory):
    """ZeRO stage -> a finished 2-rank online distillation run (_online_config: 8 steps,
    decoder_on_teacher_latents and the adversarial term on), made at its first use; the tests that
    take it only read it, and one that resumes it resumes a copy. The distillation and adversarial
    tests each ran their own run before (merged on purpose: the same launches, asserted together)."""
    made: dict[int, Path] = {}

    def get(stage: int) -> Path:
        if stage not in made:
            run = tmp_path_factory.mktemp(f"online-zero{stage}") / "run"
            write_run(run, _online_config(clip_dir, teacher_dir, stage))
            _run_to_end(run, 2)
            made[stage] = run
        return made[stage]

    return get


def test_distillation_run_reports_its_losses(online_runs):
    # the ZeRO-2 online run's every step: the distillation terms are reported and in the total
    steps = events(online_runs(2), 0, "step")
    assert len(steps) == 8
    for e in steps:
        assert e["distill_loss"] > 0 and e["decoder_teacher_loss"] > 0
        assert e["loss"] > e["recon_loss"]  # the distillation terms are in the total


@pytest.mark.parametrize("stage", [2, 3])
def test_online_distillation_latent_loss_falls(online_runs, stage):
    run = online_runs(stage)
    start = events(run, 0, "start")[0]
    assert start["teacher"] == "online" and start["teacher_loaded"] is True
    distill = [e["distill_loss"] for e in events(run, 0, "step")]
    assert len(distill) == 8 and _falls(distill), distill


def test_cached_latents_train_without_the_teacher(teacher_dir, tmp_path, clip_dir):
    """cache-latents over the run's 2 processes, then the teacher directory is moved away: the
    ZeRO-3 run trains from the cache alone, and says so."""
    import shutil

    teacher = tmp_path / "teacher"
    shutil.copytree(teacher_dir, teacher)
    cache = tmp_path / "cache"
    run = write_run(
        tmp_path / "run", _distill_config(clip_dir, 3, teacher=str(teacher), teacher_cache=str(cache))
    )
    launch = _run_to_end(run, 2, args=("cache-latents", "--run", str(run), "--size", "64x64"))
    assert "manifest written" in launch.log.read_text()
    manifest = json.loads((cache / "manifest.json").read_text())
    assert len(manifest["clips"]) == len(list(clip_dir.glob("*.mp4")))
    teacher.rename(tmp_path / "teacher-gone")
    _run_to_end(run, 2)
    for rank in (0, 1):
        start = events(run, rank, "start")[0]
        assert start["teacher"] == "cache" and start["teacher_loaded"] is False
    distill = [e["distill_loss"] for e in events(run, 0, "step")]
    assert len(distill) == 8 and _falls(distill), distill


@pytest.mark.parametrize("stage", [2, 3])
def test_adversarial_term_is_logged_checkpointed_and_resumed(online_runs, tmp_path, stage):
    import shutil

    from safetensors.torch import load_file

    from trainer.discriminator import state_digest

    shared = online_runs(stage)
    steps = events(shared, 0, "step")
    assert len(steps) == ONLINE_STEPS and all(e["adv_g_loss"] > 0 and e["adv_d_loss"] > 0 for e in steps)
    tb = b"".join(p.read_bytes() for p in (shared / "tensorboard").glob("events.*"))
    assert b"train/adv_d_loss" in tb and b"train/adv_g_loss" in tb
    for step in (ONLINE_CHECKPOINT_EVERY, ONLINE_STEPS):  # the interval's checkpoint and the final one
        manifest = json.loads((shared / "checkpoints" / f"step-{step}" / "manifest.json").read_text())
        assert "trainer/discriminator.safetensors" in manifest["files"], step
        assert manifest["parts"] == ["discriminator"], step
    ckpt = shared / "checkpoints" / f"step-{ONLINE_STEPS}"
    saved = state_digest(load_file(str(ckpt / "trainer" / "discriminator.safetensors")))

    run = tmp_path / "run"  # resumed in a copy: the shared run is only read
    shutil.copytree(shared, run)
    raw = tomllib.loads((run / "run.toml").read_text())
    raw["optim"]["max_steps"] = ONLINE_STEPS + 1
    write_run(run, raw)
    _run_to_end(run, 2, args=("--resume", "latest"))
    starts = [e for r in (0, 1) for e in events(run, r, "start") if e.get("resumed_from")]
    assert len(starts) == 2
    for s in starts:  # every rank starts again from the saved discriminator and its optimizer
        assert s["resumed_from"].endswith(f"step-{ONLINE_STEPS}"), s
        assert s["discriminator_digest"] == saved
        assert s["discriminator_steps"] == ONLINE_STEPS * raw["optim"]["grad_accum"]


def test_taew2_1_distils_from_a_wan_vae_on_2_ranks(wan_dir, tmp_path, clip_dir):
    """The author's notebook's recipe: taew2_1 from the Wan 2.1 VAE (a small random one saved with
    save_pretrained), online, on 2 DeepSpeed ranks; distill_loss is in every step event."""
    raw = base_config(
        clip_dir,
        model={"family": "taew2_1"},
        optim={"max_steps": 2},
        loss={"teacher": str(wan_dir)},
        schedule={"checkpoint_every": 100, "val_every": 100},
    )
    run = write_run(tmp_path / "run", raw)
    _run_to_end(run, 2)
    assert events(run, 0, "start")[0]["teacher"] == "online"
    steps = events(run, 0, "step")
    assert len(steps) == 2 and all(e["distill_loss"] > 0 for e in steps), steps
    assert (run / "final" / "taew2_1.safetensors").is_file()
    # the author's class loads the export by its name alone, strictly (test_family_runs: the others)
    from tests.trainer.test_families import AuthorTAE
    from trainer.model import TAEHV

    trained = TAEHV.from_file(run / "final" / "taew2_1.safetensors")
    assert trained.family == "taew2_1"
    author = AuthorTAE(str(run / "final" / "taew2_1.pth")).state_dict()
    assert all(torch.equal(author[k], v) for k, v in trained.state_dict().items())
