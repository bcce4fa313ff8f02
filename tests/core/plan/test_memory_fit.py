"""Memory fit and the model arithmetic behind it (no torch: these are plan-time numbers)."""

from __future__ import annotations

import dataclasses

import pytest

from taehv_console.core.plan.footprint import activation_elements, parameter_count
from taehv_console.core.plan.planner import MemoryFit, estimate_memory, model_state_bytes
from trainer.config import ModelSection, config_from_dict


def test_parameter_count_matches_the_published_taehv():
    # FACTS.md: 11,315,539 in total, encoder 1,470,928, decoder 9,844,611. If the layer list in
    # footprint.py drifts from the real model, every memory and traffic figure drifts with it.
    count = parameter_count(ModelSection())
    assert (count.encoder, count.decoder, count.total) == (1_470_928, 9_844_611, 11_315_539)


def test_parameter_count_follows_model_settings():
    # latent 32 widens the encoder's last conv (64->32) and the decoder's first (32->256)
    wide = parameter_count(ModelSection(latent_channels=32))
    assert wide.encoder - 1_470_928 == 16 * 64 * 9 + 16
    assert wide.decoder - 9_844_611 == 16 * 256 * 9


def test_activations_scale_with_clip_size_and_checkpointing_cuts_them():
    m = ModelSection()
    base = activation_elements(m, 12, 480, 720).total
    # every layer's count is linear in frames and in pixels (the strides divide exactly here)
    assert activation_elements(m, 24, 480, 720).total == 2 * base
    assert activation_elements(m, 12, 480, 1440).total == 2 * base
    ckpt = activation_elements(ModelSection(activation_checkpointing=True), 12, 480, 720)
    # checkpointing keeps stage inputs plus one stage being recomputed: well under half
    assert ckpt.largest_stage > 0 and ckpt.largest_stage < ckpt.total < 0.5 * base


def test_zero_stages_partition_model_states():
    p, n = 11_315_539, 8
    s0 = model_state_bytes(p, 0, n, "bf16")
    s2 = model_state_bytes(p, 2, n, "bf16")
    s3 = model_state_bytes(p, 3, n, "bf16")
    assert sum(s0.values()) == 16 * p  # 2 + 2 + 12 bytes per parameter, ~181 MB
    assert s2["weights"] == 2 * p and s2["gradients"] == 2 * p / n and s2["optimizer"] == 12 * p / n
    assert s3["weights"] == 2 * p / n


def test_estimate_memory_contract_for_preflight():
    # preflight (issue 4) relies on these exact attribute names and types
    fit = estimate_memory(config_from_dict({"optim": {"batch_per_gpu": 8}}))
    assert isinstance(fit, MemoryFit) and dataclasses.is_dataclass(fit)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fit.fits = False  # type: ignore[misc]
    assert isinstance(fit.fits, bool) and isinstance(fit.notes, tuple)
    assert fit.gpu_gb == 80.0
    assert sum(fit.breakdown.values()) == pytest.approx(fit.per_gpu_gb, abs=0.01)
    # 8 clips of 12x480x720 in bf16: ~7.5 GB each at the step's peak, inside an 80 GB H100
    assert fit.fits and 50 < fit.per_gpu_gb < 75


def test_too_big_a_batch_does_not_fit_and_says_what_to_do():
    cfg = config_from_dict({"optim": {"batch_per_gpu": 32}, "topology": {"gpu_memory_gb": 40}})
    fit = estimate_memory(cfg)
    assert not fit.fits and fit.per_gpu_gb > 40
    assert 1 <= fit.max_batch_per_gpu < 32
    assert f"batch_per_gpu to {fit.max_batch_per_gpu}" in fit.notes[0]
    assert "activation_checkpointing" in fit.notes[0]


def test_zero3_note_says_it_cannot_help():
    fit = estimate_memory(config_from_dict({"deepspeed": {"zero_stage": 3}}))
    assert any(n.startswith("ZeRO-3 cannot help") and "~181 MB" in n for n in fit.notes)
    fit2 = estimate_memory(config_from_dict({"deepspeed": {"zero_stage": 2}}))
    assert not any("ZeRO-3" in n for n in fit2.notes)


def test_estimate_matches_a_measured_step():
    # benchmarks/activation_memory.py on CPU (fp32, one 12x120x176 clip, peak RSS of a real
    # forward + backward): 876 MB without checkpointing, 551 MB with. The estimate (peak x 4
    # bytes + 10% workspace) must stay within 15% of both, or the fit verdicts are guesses.
    for ckpt, measured_mb in ((False, 876.4), (True, 551.4)):
        a = activation_elements(ModelSection(activation_checkpointing=ckpt), 12, 120, 176)
        assert a.peak * 4 * 1.1 / 1e6 == pytest.approx(measured_mb, rel=0.15)


def test_cpu_processes_count_fp32():
    cfg = config_from_dict(
        {
            "topology": {"device": "cpu", "gpus_per_node": 2, "gpu_memory_gb": 4},
            "data": {"frames": 8, "height": 64, "width": 64},
        }
    )
    fit = estimate_memory(cfg)
    # fp32 on CPU ("auto"): 4-byte weights, and activations at 4 bytes per element
    assert fit.breakdown["weights"] == pytest.approx(4 * 11_315_539 / 1e9, abs=1e-3)
    assert fit.activations_per_clip_gb == pytest.approx(
        activation_elements(ModelSection(), 8, 64, 64).peak * 4 / 1e9, abs=1e-4
    )
