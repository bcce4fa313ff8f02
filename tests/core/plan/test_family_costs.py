"""The planner's figures are the run's family's: parameters (exactly the model's), FLOPs, clips/s and
the teacher's encode per clip come from the family's shapes (trainer/flops.py, core/plan/teacher.py),
and `taehv-console plan` names the family and prints its figures."""

from __future__ import annotations

import json

import pytest

from taehv_console.cli import main
from taehv_console.core.plan.footprint import activation_elements, parameter_count
from taehv_console.core.plan.planner import make_plan
from taehv_console.core.plan.presets import load_preset
from taehv_console.core.plan.teacher import TEACHER_ENCODE, teacher_encode_flop
from trainer.config import ConfigError, ModelSection
from trainer.families import FAMILIES, clip_rule
from trainer.flops import flop_per_clip_step, mfu
from trainer.model import TAEHV

CLIP = ["data.frames=16", "data.width=704"]  # a clip every family's rule takes: 8 and 17 aside


def _clip(family: str) -> list[str]:
    return ["data.frames=17", "data.width=704"] if clip_rule(family).frame_quantum == 17 else CLIP


def _plan(family: str, *more: str):
    cfg = load_preset("8gpu-h100", overrides=[f"model.family={family}", *_clip(family), *more]).config
    return make_plan(cfg, gpu="H100")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_parameters_are_the_models(family):
    model = TAEHV.for_family(family)
    count = parameter_count(ModelSection(family=family))
    assert count.encoder == sum(p.numel() for p in model.encoder.parameters())
    assert count.decoder == sum(p.numel() for p in model.decoder.parameters())


def test_clips_per_s_follow_the_familys_flops_and_agree_with_the_trainers_mfu():
    plans = {f: _plan(f) for f in FAMILIES}
    utilisation = set()
    for family, plan in plans.items():
        d = plan.config.data
        step = flop_per_clip_step(d.frames, d.height, d.width, model=family)
        # the planner's clips/s at the trainer's count of FLOPs: one MFU for every family (taehv's)
        utilisation.add(
            round(mfu(plan.time.clips_per_s_per_gpu, d.frames, d.height, d.width, 1, 989, model=family), 9)
        )
        assert plan.memory.parameters == parameter_count(plan.config.model).total
        assert step > 0
    assert len(utilisation) == 1
    taehv = plans["taehv"].time.clips_per_s_per_gpu
    assert plans["taew2_2"].time.clips_per_s_per_gpu == pytest.approx(4 * taehv, rel=0.05)
    assert plans["taeltx_2"].time.clips_per_s_per_gpu > 14 * taehv
    assert plans["taew2_2_super"].time.clips_per_s_per_gpu < plans["taew2_2"].time.clips_per_s_per_gpu
    # a smaller student holds more clips per GPU
    assert plans["taew2_2"].memory.max_batch_per_gpu > 3 * plans["taehv"].memory.max_batch_per_gpu


def test_each_family_has_its_teachers_encode():
    assert set(TEACHER_ENCODE) == set(FAMILIES)
    for family, t in TEACHER_ENCODE.items():
        assert t.teacher_class == FAMILIES[family].teacher_class
    assert teacher_encode_flop("taehv", 12, 480, 720) == pytest.approx(29.9e12, rel=0.01)  # FACTS
    online = {f: _plan(f, 'loss.teacher="/models/vae"').teacher for f in ("taehv", "taew2_1", "taeltx_2")}
    assert online["taew2_1"].encode_tflop < online["taehv"].encode_tflop  # Wan 2.1's VAE is lighter
    # LTX-2's VAE against a patch-4 student: many student steps per encode
    assert online["taeltx_2"].encode_ratio > 3 * online["taehv"].encode_ratio
    assert "estimate" in _plan("taeltx2_3", 'loss.teacher="/models/vae"').teacher.note


def _cli(capsys, family: str, *extra: str) -> str:
    args = ["plan", "--preset", "8gpu-h100", "--set", f"model.family={family}"]
    for kv in CLIP:
        args += ["--set", kv]
    assert main([*args, "--set", 'loss.teacher="/models/vae"', *extra]) == 0
    return capsys.readouterr().out


def test_plan_prints_the_familys_figures_and_names_it(capsys):
    ltx, taehv = (json.loads(_cli(capsys, f, "--json"))["plan"] for f in ("taeltx_2", "taehv"))
    assert ltx["model"]["family"] == "taeltx_2" and taehv["model"]["family"] == "taehv"
    assert ltx["model"]["tflop_per_clip_step"] < taehv["model"]["tflop_per_clip_step"] / 14
    assert ltx["time"]["clips_per_s_per_gpu"] > 14 * taehv["time"]["clips_per_s_per_gpu"]
    assert ltx["teacher"]["teacher_class"] == "AutoencoderKLLTX2Video"
    assert ltx["teacher"]["encode_tflop_per_clip"] != taehv["teacher"]["encode_tflop_per_clip"]
    assert ltx["memory"]["max_batch_per_gpu"] > taehv["memory"]["max_batch_per_gpu"]
    text = _cli(capsys, "taeltx_2")
    assert "model         taeltx_2 (LTX-2)" in text
    assert "taeltx_2's teacher AutoencoderKLLTX2Video" in text
    assert "scaled by FLOPs per clip-step to taeltx_2" in " ".join(text.split())


def test_the_teachers_figures_are_what_torch_counts():
    """Each teacher's figure, counted again: its diffusers class with the stored config on the meta
    device (no weights, no compute), FlopCounterMode over the encode trainer/teacher.py runs."""
    diffusers = pytest.importorskip("diffusers")
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    for t in {id(t): t for t in TEACHER_ENCODE.values()}.values():
        frames, height, width = t.clip
        with torch.device("meta"):
            vae = getattr(diffusers, t.teacher_class)(**dict(t.overrides)).eval()
            x = torch.rand(1, 3, frames, height, width)
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter:
            vae.encode(x).latent_dist.mode()
        assert counter.get_total_flops() / 1e12 == pytest.approx(t.tflop, abs=0.001), t.teacher_class


def _saved_by_autograd(family: str, clip: tuple[int, int, int]) -> int:
    """Elements autograd keeps for one clip's training step (its storages, the weights left out)."""
    import torch
    import torch.nn.functional as F

    from trainer.model import reconstruction_target

    model = TAEHV.for_family(family).train()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    x = torch.rand(1, clip[0], 3, clip[1], clip[2])
    kept: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            kept[ptr] = t.untyped_storage().nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, y = model(x, clamp=False)
        F.mse_loss(y, reconstruction_target(x, y.shape[1]))
    return sum(kept.values())


def test_activations_follow_the_familys_layers():
    """footprint's count against what autograd saves, for every kind of family: patch 2 and 4, the
    super decoder, H3's chunks. The base decoder's count is the high one (it keeps the upsampled
    tensor the trainer's order never makes: calibrated on taehv against a measured step, see
    footprint.activation_elements); the super decoder's matches autograd's."""
    for family in ("taehv", "taew2_2", "taew2_2_super", "taeltx_2", "taeh3"):
        clip = (clip_rule(family).frame_quantum, 64, 64)
        counted = activation_elements(ModelSection(family=family), *clip).saved
        assert 0.9 < counted / _saved_by_autograd(family, clip) < 1.4, family


def test_a_family_set_on_a_preset_fits_its_clip_and_says_what_moved():
    """Presets are family-neutral on the command line too: a family set with --set takes the preset's
    clip fitted to its rule (as the wizard's choice does) and the fit is recorded; a clip value set
    with --set as well is the user's, checked and never moved."""
    ltx = load_preset("8gpu-h100", overrides=["model.family=taeltx_2"])
    d = ltx.config.data
    assert (ltx.config.model.family, d.frames, d.height, d.width) == ("taeltx_2", 16, 480, 704)
    assert [f.setting for f in ltx.fitted] == ["data.frames=16", "data.width=704"]
    assert ltx.fitted_text == (
        "taeltx_2's clip rule: frames 12 → 16 (a multiple of 8); crop width 720 → 704 (a multiple of 32)"
    )
    assert ltx.explicit["data"]["frames"] == 16  # what the run was asked for, fitted values included
    h3 = load_preset("cpu-smoke", overrides=["model.family=taeh3"], user_dir=None)
    assert h3.config.data.frames == 17 and [f.key for f in h3.fitted] == ["data.frames"]
    assert not load_preset("8gpu-h100", overrides=["model.family=taew2_1"]).fitted  # its clip fits
    # a clip value given too: that one is checked (and refused), the other still fitted
    with pytest.raises(ConfigError) as err:
        load_preset("8gpu-h100", overrides=["model.family=taeltx_2", "data.frames=12"])
    assert "data.frames: must be a multiple of 8" in str(err.value) and "data.width" not in str(err.value)


def test_plan_with_a_family_prints_that_familys_figures_on_every_preset(capsys):
    assert main(["plan", "--json"]) == 0
    taehv = {p["name"]: p for p in json.loads(capsys.readouterr().out)["plans"]}
    assert main(["plan", "--json", "--set", "model.family=taeltx_2"]) == 0
    ltx = {p["name"]: p for p in json.loads(capsys.readouterr().out)["plans"]}
    assert ltx.keys() == taehv.keys() and len(ltx) > 3
    for name, plan in ltx.items():
        assert plan["model"]["family"] == "taeltx_2" and taehv[name]["model"]["family"] == "taehv"
        assert plan["time"]["clips_per_s_per_gpu"] > 10 * taehv[name]["time"]["clips_per_s_per_gpu"]
        assert "taeltx_2's clip rule: frames" in plan["clip_fitted"] and taehv[name]["clip_fitted"] == ""
    assert main(["plan", "--set", "model.family=taeltx_2"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "clip [8gpu-a800, 8gpu-h100," in text and "frames 12 → 16 (a multiple of 8)" in text
    # one preset: the values moved are in its reasons, said as such
    assert main(["plan", "--json", "--preset", "8gpu-h100", "--set", "model.family=taeltx_2"]) == 0
    out = json.loads(capsys.readouterr().out)
    why = {r["key"]: (r["value"], r["reason"]) for r in out["reasons"]}
    assert why["data.frames"] == (16, "taeltx_2's clip rule: frames 12 → 16 (a multiple of 8)")
    assert why["data.width"] == (704, "taeltx_2's clip rule: crop width 720 → 704 (a multiple of 32)")
    assert (out["config"]["data"]["frames"], out["config"]["data"]["width"]) == (16, 704)
