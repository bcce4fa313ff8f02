"""TAEHV model: published names and shapes, weight loading, causality, and the speed options
(activation checkpointing, channels_last, torch.compile) giving identical results."""

import json
from pathlib import Path

import pytest
import torch

from trainer.model import TAEHV, MemBlock, WeightsError, load_weights, reconstruction_target

# The published taehv.pth parameter names and shapes, copied into the repo so a user checkout has it.
REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "taehv_state_dict.json"


def test_default_model_has_exactly_the_published_keys_and_shapes():
    ref = json.loads(REFERENCE.read_text())
    sd = TAEHV().state_dict()
    assert sorted(sd) == sorted(ref["state_dict"])
    wrong = {k: (list(sd[k].shape), v) for k, v in ref["state_dict"].items() if list(sd[k].shape) != v}
    assert not wrong
    assert sum(p.numel() for p in TAEHV().parameters()) == ref["total_parameters"] == 11_315_539


def test_shapes_through_encode_and_decode():
    m = TAEHV().eval()
    x = torch.rand(2, 8, 3, 32, 48)
    with torch.no_grad():
        z = m.encode(x)
        y = m.decode(z)
    assert z.shape == (2, 2, 16, 4, 6)
    assert y.shape == (2, 5, 3, 32, 48)  # 4k - 3 frames: the warm-up frames are dropped
    assert float(y.min()) >= 0 and float(y.max()) <= 1


def test_options_change_the_architecture():
    m = TAEHV(latent_channels=8, patch_size=2)
    assert m.encoder[0].weight.shape == (64, 12, 3, 3)
    assert m.decoder[-1].weight.shape == (12, 64, 3, 3)
    z = m.encode(torch.rand(1, 4, 3, 32, 32))
    assert z.shape == (1, 1, 8, 2, 2)  # patch 2 then 8x: 1/16 of the size
    m = TAEHV(encoder_time_downscale=(True, False, False), decoder_time_upscale=(False, False, True))
    assert m.encode(torch.rand(1, 4, 3, 16, 16)).shape[1] == 2
    with pytest.raises(ValueError):
        TAEHV(encoder_time_downscale=(True, True, True))


def test_odd_frame_counts_are_padded_by_repeating_the_last_frame():
    m = TAEHV().eval()
    x = torch.rand(1, 6, 3, 16, 16)
    with torch.no_grad():
        padded = torch.cat([x, x[:, -1:], x[:, -1:]], 1)
        assert torch.equal(m.encode(x), m.encode(padded))


def _sequential_memblock_reference(model: TAEHV, x: torch.Tensor) -> torch.Tensor:
    """Encoder run frame by frame with explicit memory: what the parallel form must equal."""
    n = x.shape[0]
    frames = [x[:, t] for t in range(x.shape[1])]
    for layer in model.encoder:
        if isinstance(layer, MemBlock):
            past = torch.zeros_like(frames[0])
            out = []
            for f in frames:
                out.append(layer(f, past))
                past = f
            frames = out
        elif layer.__class__.__name__ == "TPool":
            s = layer.stride
            frames = [
                layer(torch.stack(frames[i : i + s], 1).reshape(n * s, *frames[0].shape[1:]))
                for i in range(0, len(frames), s)
            ]
        else:
            frames = [layer(f) for f in frames]
    return torch.stack(frames, 1)


def test_parallel_encode_equals_frame_by_frame_and_is_causal():
    torch.manual_seed(0)
    m = TAEHV().eval()
    x = torch.rand(2, 8, 3, 16, 24)
    with torch.no_grad():
        par = m.encode(x)
        seq = _sequential_memblock_reference(m, x)
        assert torch.allclose(par, seq, atol=1e-5)
        # causal: changing the last 4 frames leaves the first latent untouched
        x2 = x.clone()
        x2[:, 4:] = torch.rand_like(x2[:, 4:])
        z2 = m.encode(x2)
        assert torch.allclose(par[:, 0], z2[:, 0], atol=1e-6)
        assert (par[:, 1] - z2[:, 1]).abs().max() > 1e-6  # later latents do see the change


def test_reconstruction_alignment_is_the_first_frames():
    video = torch.arange(12).float().reshape(1, 12, 1, 1, 1)
    target = reconstruction_target(video, 9)
    assert target.flatten().tolist() == list(range(9))


def test_decoder_starts_at_mid_grey():
    assert torch.all(TAEHV().decoder[-1].bias == 0.5)


def test_init_keeps_the_signal_and_starts_memblocks_as_identity():
    torch.manual_seed(0)
    m = TAEHV().eval()
    blocks = [b for b in m.modules() if isinstance(b, MemBlock)]
    assert len(blocks) == 18
    assert all(
        torch.count_nonzero(b.conv[-1].weight) == 0 and torch.count_nonzero(b.conv[-1].bias) == 0
        for b in blocks
    )
    x = torch.relu(torch.randn(2, 64, 8, 8))
    assert torch.equal(blocks[0](x, torch.rand_like(x)), x)  # identity until it learns
    # fan-in Kaiming (std sqrt(2 / fan_in)) on every other conv
    w = m.decoder[1].weight
    assert abs(w.std().item() - (2 / (w.shape[1] * 9)) ** 0.5) < 0.1 * (2 / (w.shape[1] * 9)) ** 0.5
    # the decoded frames have spatial structure from the first step (PyTorch's default init: ~0.001)
    with torch.no_grad():
        _z, y = m(torch.rand(1, 8, 3, 64, 64), clamp=False)
    assert y.std(dim=(-1, -2)).mean() > 0.05


def test_training_output_is_unclamped_and_inference_clamps():
    torch.manual_seed(0)
    m = TAEHV().eval()
    x = torch.rand(1, 4, 3, 32, 32)
    with torch.no_grad():
        _z, raw = m(x, clamp=False)
        _z, out = m(x)
    assert raw.min() < 0 or raw.max() > 1  # some pixels overshoot at init ...
    assert torch.equal(out, raw.clamp(0, 1))  # ... and the default output clamps them


def test_load_weights_pth_and_safetensors(tmp_path):
    from safetensors.torch import save_file

    src = TAEHV()
    torch.save(src.state_dict(), tmp_path / "w.pth")
    save_file(src.state_dict(), str(tmp_path / "w.safetensors"))
    for name in ("w.pth", "w.safetensors"):
        dst = TAEHV()
        load_weights(dst, tmp_path / name)
        assert all(torch.equal(a, b) for a, b in zip(src.state_dict().values(), dst.state_dict().values()))


def test_load_weights_strict_lists_missing_and_unexpected_keys(tmp_path):
    sd = TAEHV().state_dict()
    sd.pop("decoder.22.bias")
    sd["extra.weight"] = torch.zeros(1)
    torch.save(sd, tmp_path / "bad.pth")
    with pytest.raises(WeightsError) as err:
        load_weights(TAEHV(), tmp_path / "bad.pth")
    msg = str(err.value)
    assert "bad.pth" in msg and "decoder.22.bias" in msg and "extra.weight" in msg
    load_weights(TAEHV(), tmp_path / "bad.pth", strict=False)  # non-strict loads what matches
    with pytest.raises(WeightsError, match="no such weights file"):
        load_weights(TAEHV(), tmp_path / "missing.pth")
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(WeightsError, match="junk.pth: cannot read"):
        load_weights(TAEHV(), tmp_path / "junk.pth")


def test_load_weights_wrong_shape_is_named(tmp_path):
    torch.save(TAEHV(latent_channels=8).state_dict(), tmp_path / "lc8.pth")
    with pytest.raises(WeightsError, match="encoder.17.weight"):
        load_weights(TAEHV(), tmp_path / "lc8.pth")


def _grads(model: TAEHV, x: torch.Tensor) -> tuple[torch.Tensor, dict]:
    model.zero_grad()
    _z, y = model(x)
    loss = ((y - reconstruction_target(x, y.shape[1])) ** 2).mean()
    loss.backward()
    return y.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_activation_checkpointing_gives_identical_results_and_really_recomputes():
    torch.manual_seed(0)
    x = torch.rand(1, 8, 3, 32, 32)
    plain = TAEHV().train()
    ckpt = TAEHV(activation_checkpointing=True).train()
    ckpt.load_state_dict(plain.state_dict())
    calls = {"n": 0}

    def count(_m, _i, _o):
        calls["n"] += 1

    ckpt.encoder[4].register_forward_hook(count)
    y1, g1 = _grads(plain, x)
    y2, g2 = _grads(ckpt, x)
    assert torch.allclose(y1, y2, atol=1e-6)
    assert all(torch.allclose(g1[k], g2[k], atol=1e-5, rtol=1e-4) for k in g1)
    # forward once + recomputed once in backward
    assert calls["n"] == 2


def test_channels_last_gives_identical_results():
    torch.manual_seed(0)
    x = torch.rand(1, 8, 3, 32, 32)
    a = TAEHV().train()
    b = TAEHV().train()
    b.load_state_dict(a.state_dict())
    b.use_channels_last()
    # weights keep their layout (DeepSpeed views parameters as flat bytes); activations go NHWC
    assert all(p.is_contiguous() for p in b.parameters())
    layouts = []
    b.decoder[4].conv[0].register_forward_pre_hook(
        lambda _m, args: layouts.append(args[0].is_contiguous(memory_format=torch.channels_last))
    )
    y1, g1 = _grads(a, x)
    y2, g2 = _grads(b, x)
    assert layouts and all(layouts)
    assert torch.allclose(y1, y2, atol=1e-4)  # summation order differs between layouts
    assert all(torch.allclose(g1[k], g2[k], atol=1e-4, rtol=1e-3) for k in g1)
