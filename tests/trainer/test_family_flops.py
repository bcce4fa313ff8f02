"""trainer/flops.py's count of a training step, family by family, against torch's own count of the
model's convolutions (FlopCounterMode over TAEHV.for_family on the meta device), at several clip
sizes: the analytic count must match it exactly (it models the same layers, in the order the trainer
runs them, with the same warm-up trim and H3's chunks)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode, conv_backward_flop

from trainer import flops
from trainer.families import FAMILIES, clip_rule
from trainer.model import TAEHV, reconstruction_target

aten = torch.ops.aten
_torch_formula = conv_backward_flop.__wrapped__  # on shapes (FlopCounterMode passes ours shapes too)


def _conv_backward_per_group(grad_out_shape, x_shape, w_shape, *args, **kwargs) -> int:
    """torch's formula, with a grouped convolution's weight gradient counted once: torch 2.13 counts
    it `groups` times over (it sizes it as a dense conv of all input channels), which for the super
    decoder's 7x7 depthwise convs would be 1024x their real cost."""
    groups = args[6]
    if groups == 1:
        return _torch_formula(grad_out_shape, x_shape, w_shape, *args, **kwargs)
    mask = list(args[7])
    grad_input = _torch_formula(
        grad_out_shape, x_shape, w_shape, *args[:7], [mask[0], False, False], **kwargs
    )
    grad_weight = _torch_formula(
        grad_out_shape, x_shape, w_shape, *args[:7], [False, mask[1], False], **kwargs
    )
    return grad_input + grad_weight // groups


def _counted(family: str, frames: int, height: int, width: int, teacher_decode: bool) -> tuple[int, int]:
    """(forward, whole step) FLOPs of one clip, counted by torch on the meta device."""
    with torch.device("meta"):
        model = TAEHV.for_family(family).train()
        x = torch.rand(1, frames, 3, height, width)
    fwd = FlopCounterMode(display=False)
    with fwd:
        model(x, clamp=False)
    step = FlopCounterMode(
        display=False, custom_mapping={aten.convolution_backward: _conv_backward_per_group}
    )
    with step:
        z, y = model(x, clamp=False)
        loss = F.mse_loss(y, reconstruction_target(x, y.shape[1]))
        if teacher_decode:
            latents = torch.rand_like(z)  # the teacher's: as many as the student's, no gradient
            y_t = model.decode(latents, clamp=False)
            loss = loss + F.mse_loss(z, latents) + F.mse_loss(y_t, y)
        loss.backward()
    return fwd.get_total_flops(), step.get_total_flops()


def _clips(family: str) -> list[tuple[int, int, int]]:
    rule = clip_rule(family)
    q, s = rule.frame_quantum, rule.space_scale
    return [(q, 2 * s, 3 * s), (3 * q, 3 * s, 2 * s)]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_count_is_the_models_own(family):
    for clip in _clips(family):
        fwd, step = _counted(family, *clip, teacher_decode=False)
        assert flops.forward_flops(family, *clip).total == fwd, clip
        assert flops.flop_per_clip_step(*clip, model=family) == step, clip
    clip = _clips(family)[1]
    _, step = _counted(family, *clip, teacher_decode=True)
    assert flops.flop_per_clip_step(*clip, teacher_decode=True, model=family) == step


def test_taehv_reproduces_the_facts_and_the_families_scale_by_patch():
    f = flops.forward_flops("taehv", 12, 480, 720)
    assert f.encoder == pytest.approx(flops.ENCODER_FORWARD, rel=0.01)
    assert flops.flop_per_clip_step(12, 480, 720) == pytest.approx(flops.FLOP_PER_CLIP_STEP, rel=0.07)
    step = {name: flops.flop_per_clip_step(24, 480, 736, model=name) for name in FAMILIES}
    assert step["taew2_1"] == step["taehv"]
    # CogVideoX keeps an even number of latents' warm-up frames: its last two convolutions run on them
    assert step["taehv"] < step["taecvx"] < 1.03 * step["taehv"]
    # a patch-2 student runs at a quarter of the pixels, a patch-4 one at a sixteenth (and LTX's
    # 8x time halves its deepest stages once more)
    assert step["taew2_2"] / step["taehv"] == pytest.approx(1 / 4, rel=0.05)
    assert 1 / 20 < step["taeltx_2"] / step["taehv"] < 1 / 14
    # the wide decoder costs about twice the base one
    assert flops.forward_flops("taew2_2_super", 24, 480, 736).decoder / flops.forward_flops(
        "taew2_2", 24, 480, 736
    ).decoder == pytest.approx(1.5, rel=0.1)


def test_a_custom_model_is_costed_from_its_knobs():
    from trainer.config import ModelSection

    taehv = ModelSection()
    assert flops.architecture(taehv) == flops.architecture("taehv")
    wide = ModelSection(family="custom", latent_channels=16, patch_size=2)
    assert flops.architecture(wide).patch_size == 2
    assert flops.flop_per_clip_step(12, 64, 64, model=wide) < flops.flop_per_clip_step(
        12, 64, 64, model=taehv
    )


def test_mfu_counts_the_runs_family():
    args = (10.0, 12, 480, 736, 1, 989.0)
    assert flops.mfu(*args, model="taew2_2") == pytest.approx(flops.mfu(*args) / 4, rel=0.05)
