"""Distillation to a teacher VAE (HunyuanVideo's AutoencoderKLHunyuanVideo) loaded from a local
diffusers directory: a small randomly initialised one that the test saves itself."""

from __future__ import annotations

import pytest
import torch

from tests.trainer.runs import Launch, base_config, events, run_to_end, write_run

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
        t = teacher.encode(x[:, : 8 - model.frames_to_trim].mul(2).sub(1).permute(0, 2, 1, 3, 4)).latent_dist.mode()
        y = model.decode(t.permute(0, 2, 1, 3, 4))
    assert t.permute(0, 2, 1, 3, 4).shape == z.shape
    assert y.shape[1] == 8 - model.frames_to_trim  # decoding teacher latents gives the aligned frames


def test_distillation_run_reports_its_losses(teacher_dir, tmp_path, clip_dir):
    run = write_run(tmp_path / "run", base_config(
        clip_dir, topology={"gpus_per_node": 1}, optim={"max_steps": 3},
        loss={"teacher": str(teacher_dir), "decoder_on_teacher_latents": True},
        schedule={"checkpoint_every": 100, "val_every": 100},
    ))  # fmt: skip
    run_to_end(run, 1)
    steps = events(run, 0, "step")
    assert len(steps) == 3
    for e in steps:
        assert e["distill_loss"] > 0 and e["decoder_teacher_loss"] > 0
        assert e["loss"] > e["recon_loss"]  # the distillation terms are in the total


def test_a_teacher_that_cannot_be_loaded_is_an_error_not_a_substitute(tmp_path, clip_dir):
    bad = tmp_path / "not-a-teacher"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    run = write_run(tmp_path / "run", base_config(clip_dir, topology={"gpus_per_node": 1},
                                                   loss={"teacher": str(bad)}))  # fmt: skip
    launch = Launch(run, 1)
    assert launch.wait() != 0
    log = launch.log.read_text()
    assert "loss.teacher" in log and str(bad) in log
    assert not events(run, 0, "step")
