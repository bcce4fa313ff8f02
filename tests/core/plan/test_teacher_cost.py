"""The planner counts the teacher VAE's cost: online (HunyuanVideo's VAE: 29.9 TFLOP encode per
12x480x720 clip, 5.2x the student's 5.73 TFLOP step, trainer/flops.py) and cached (paid once by
cache-latents), side by side."""

from __future__ import annotations

import json

import pytest

from taehv_console.cli import main
from taehv_console.core.plan.planner import make_plan
from taehv_console.core.plan.presets import load_preset
from trainer.flops import flop_per_clip_step


def _plan(*overrides):
    return make_plan(load_preset("8gpu-h100", overrides=list(overrides)).config, gpu="H100")


def test_online_teacher_costs_its_encode_in_step_time_and_gpu_hours():
    student = _plan()
    online = _plan('loss.teacher="/models/vae"')
    cached = _plan('loss.teacher_cache="/cache"')
    t = online.teacher
    assert t.mode == "online" and cached.teacher.mode == "cached" and student.teacher.mode == "off"
    step = flop_per_clip_step(12, 480, 720) / 1e12
    decoder = flop_per_clip_step(12, 480, 720, teacher_decode=True) / 1e12 - step
    assert step == pytest.approx(5.73, abs=0.01) and decoder == pytest.approx(3.86, abs=0.01)
    assert t.encode_tflop == pytest.approx(29.85, abs=0.01)  # FACTS: 29.9
    assert t.encode_ratio == pytest.approx(t.encode_tflop / step)
    assert t.decoder_ratio == pytest.approx(decoder / step)  # the GPU presets train the decoder on them
    compute = student.time.compute_s_per_step
    comm = student.comm.seconds_per_step
    assert online.time.step_s == pytest.approx(compute * (1 + t.encode_ratio + t.decoder_ratio) + comm)
    assert cached.time.step_s == pytest.approx(compute * (1 + t.decoder_ratio) + comm)
    assert online.time.gpu_hours == pytest.approx(t.online_gpu_hours)
    assert cached.time.gpu_hours == pytest.approx(t.cached_gpu_hours)
    assert online.time.gpu_hours / cached.time.gpu_hours == pytest.approx(
        (1 + 5.2069 + 0.6738) / 1.6738, rel=1e-3
    )
    # the one-off build: 100k windows x 5.2 student steps at 33 clips/s per H100 (measured)
    assert t.cache_build_gpu_hours == pytest.approx(100_000 * t.encode_ratio / 33.0 / 3600)
    assert student.time.step_s == pytest.approx(compute + comm)  # not distilling: student only
    assert any("teacher VAE online" in a for a in online.assumptions)


def test_plan_prints_online_and_cached_side_by_side(capsys):
    assert main(["plan", "--preset", "8gpu-h100", "--set", 'loss.teacher="/models/vae"']) == 0
    out = capsys.readouterr().out
    assert "distilling, teacher online" in out and "teacher online " in out and "cached latents " in out
    assert main(["plan", "--preset", "8gpu-h100", "--set", 'loss.teacher="/models/vae"', "--json"]) == 0
    teacher = json.loads(capsys.readouterr().out)["plan"]["teacher"]
    assert teacher["mode"] == "online"
    assert teacher["online"]["gpu_hours"] > 3 * teacher["cached"]["gpu_hours"]


def test_the_comparison_table_gives_each_preset_its_distillation_cost(capsys):
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("distilling"))
    online = _plan('loss.teacher="/models/vae"').teacher
    assert f"8gpu-h100 {online.online_gpu_hours:,.0f} / {online.cached_gpu_hours:,.0f}" in line
