"""The model's faster run (TGrow before Upsample, one permuted copy in and out of channels_last, the
MemBlock's shifted cat in one buffer) gives the published order's outputs and gradients, in NCHW and
channels_last, with the published names untouched."""

import pytest
import torch
from torch import nn

from trainer import frame_ops
from trainer.frame_ops import CatPast, drop_leading_frames, repeat_pixels, shift_one_frame, upsample_nearest
from trainer.model import TAEHV, TGrow, TPool, reconstruction_target, run_order


def _random_weights(model: TAEHV) -> TAEHV:
    # the published init starts every MemBlock as the identity (last conv zero), which would hide
    # a wrong past frame: give every weight a value
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (1.0 / max(p[0].numel(), 1)) ** 0.5)
    return model


def _step(model: TAEHV, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    model.zero_grad()
    z, y = model(x, clamp=False)
    loss = ((y - reconstruction_target(x, y.shape[1])) ** 2).mean()
    loss.backward()
    return z.detach(), y.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_faster_run_equals_the_published_order(channels_last):
    fast = _random_weights(TAEHV()).double().train()
    plain = TAEHV().double().train()
    plain.load_state_dict(fast.state_dict())
    plain.use_published_order()
    if channels_last:
        fast.use_channels_last()
        plain.use_channels_last()
    # two videos, so a frame's past never crosses into the other video
    x = torch.rand(2, 8, 3, 16, 24, dtype=torch.float64)
    z1, y1, g1 = _step(fast, x)
    z2, y2, g2 = _step(plain, x)
    assert y1.shape == (2, 5, 3, 16, 24)
    assert y1.std() > 0.1  # random weights: every block changes the signal
    torch.testing.assert_close(z1, z2, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(y1, y2, rtol=1e-9, atol=1e-9)
    assert g1.keys() == g2.keys()
    for k in g1:
        torch.testing.assert_close(g1[k], g2[k], rtol=1e-8, atol=1e-9, msg=k)
    lat = torch.randn_like(z1)  # decode on its own (teacher latents), with and without the warm-up
    with torch.no_grad():
        for trim in (True, False):
            torch.testing.assert_close(fast.decode(lat, trim), plain.decode(lat, trim), rtol=1e-9, atol=1e-9)


def test_warm_up_frames_are_dropped_before_the_per_frame_tail():
    m = TAEHV()
    tail = [type(layer).__name__ for layer in m._decoder_stages[-1].layers]
    assert tail == ["Upsample", "Conv2d", "ReLU", "Conv2d"]
    assert type(m._decoder_stages[-2].layers[-1]).__name__ == "TGrow"
    assert m._trim_before_last_stage and not TAEHV().use_published_order()._trim_before_last_stage
    seen = []
    m._decoder_stages[-1].layers[1].register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[0]))
    with torch.no_grad():
        assert m.decode(torch.randn(2, 3, 16, 2, 2)).shape == (2, 9, 3, 16, 16)
        m.decode(torch.randn(2, 3, 16, 2, 2), trim=False)
    assert seen == [2 * 9, 2 * 12]  # the full-size convs skip the 3 warm-up frames of each video


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_drop_leading_frames_keeps_each_videos_later_frames_and_the_layout(channels_last):
    x = torch.arange(2 * 4 * 3 * 2 * 2, dtype=torch.float32).reshape(8, 3, 2, 2)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    out = drop_leading_frames(x, 2, 3)
    assert torch.equal(out, x[[3, 7]])
    assert out.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert drop_leading_frames(x, 1, 3).data_ptr() == x[3:].data_ptr()  # one video: a view


def test_tgrow_runs_before_upsample_and_the_names_stay_published():
    m = TAEHV()
    names = [type(layer).__name__ for layer in run_order(list(m.decoder))]
    published = [type(layer).__name__ for layer in m.decoder]
    assert published[6:8] == ["Upsample", "TGrow"] and names[6:8] == ["TGrow", "Upsample"]
    assert names.count("Upsample") == names.count("TGrow") == 3
    assert all(names[i + 1] == "Upsample" for i, n in enumerate(names) if n == "TGrow")
    # stages only hold references: the state dict is the published flat one
    assert list(m.state_dict()) == list(TAEHV().use_published_order().state_dict())
    assert "decoder.7.conv.weight" in m.state_dict()  # TGrow keeps its published index
    # a bilinear Upsample does not commute with a 1x1 conv: it stays where it is
    seq = [nn.Upsample(scale_factor=2, mode="bilinear"), TGrow(4, 2)]
    assert run_order(seq) == seq


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_memblock_shifted_cat_matches_zeros_shift_cat_and_its_gradient(channels_last):
    x = torch.randn(6, 3, 4, 5, dtype=torch.float64)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    out = CatPast.apply(x, 2)
    assert torch.equal(out, torch.cat([x, shift_one_frame(x, 2)], 1))
    assert out.is_contiguous(memory_format=torch.channels_last) == channels_last
    assert torch.autograd.gradcheck(lambda t: CatPast.apply(t, 2), (x,))
    assert torch.autograd.gradcheck(lambda t: CatPast.apply(t, 1), (x,))
    (grad,) = torch.autograd.grad(CatPast.apply(x, 3).sum(), x)
    assert grad.is_contiguous(memory_format=torch.channels_last) == channels_last


def test_channels_last_frames_fold_in_one_copy_each_way_and_stay_channels_last():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Copies(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("clone", "copy_", "_to_copy", "contiguous"):
                Copies.n += 1
            return func(*args, **(kwargs or {}))

    pool, grow = TPool(4, 2), TGrow(4, 2)
    x = torch.randn(4, 4, 6, 5).contiguous(memory_format=torch.channels_last).requires_grad_(True)
    for layer, frames in ((pool, 2), (grow, 8)):
        y = layer(x)
        assert y.shape[0] == frames and y.is_contiguous(memory_format=torch.channels_last)
        g = torch.randn_like(y).contiguous(memory_format=torch.channels_last)
        with Copies():
            Copies.n = 0
            y = layer(x)
            assert Copies.n == 1  # the permuted copy (the 1x1 conv copies nothing)
            Copies.n = 0
            (gx,) = torch.autograd.grad(y, x, g)
            assert Copies.n == 1
        assert gx.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("limit", [None, 2 * 4 * 10 * 14], ids=["whole", "in-pieces"])
def test_upsample_nearest_keeps_dtype_and_layout_and_splits_past_the_kernel_limit(monkeypatch, limit):
    # CUDA's upsample kernels refuse outputs of 2**31 elements (a batch of 9 clips at 480x720):
    # the run splits such a batch; with a tiny limit here, into pieces of 2 frames
    if limit is not None:
        monkeypatch.setattr(frame_ops, "_MAX_KERNEL_NUMEL", limit)
    x = torch.randn(5, 4, 5, 7).to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = upsample_nearest(x, 2)
    ref = nn.functional.interpolate(x.detach().float(), scale_factor=2, mode="nearest")
    assert y.dtype == torch.bfloat16 and y.shape == (5, 4, 10, 14)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y.float(), ref)
    (y.float() * torch.arange(y.numel()).reshape(y.shape)).sum().backward()
    grad = nn.functional.avg_pool2d(torch.arange(y.numel()).reshape(y.shape).float(), 2) * 4
    torch.testing.assert_close(x.grad.float(), grad, rtol=1e-2, atol=1.0)
    assert upsample_nearest(x, 1) is x


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_repeated_pixels_are_nearest_upsampling_in_the_same_dtype_and_layout(channels_last):
    # the compiled upsample (no autocast region in the stage's graph): same values, layout and dtype
    x = torch.randn(3, 4, 5, 7).to(torch.bfloat16)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = repeat_pixels(x, 2)
    assert y.dtype == torch.bfloat16 and y.shape == (3, 4, 10, 14)
    assert torch.equal(y.float(), nn.functional.interpolate(x.float(), scale_factor=2, mode="nearest"))
    assert y.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
