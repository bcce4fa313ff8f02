"""Every TAE family computes what the author's class computes for it: the same latents and frames,
in parallel and frame by frame, at clip lengths that reach each family's edge cases (H3's 17-frame
chunks, its 3 dropped latents and 5-latent decode chunks; CogVideoX's untrimmed even latent counts;
LTX's 8x time and 7 warm-up frames). The reference below is written from the published conventions
(docs/reference/FACTS.md, "The TAE families"): its own module tree, so the author's parameter names
are checked too, its own loader that picks the family from the file name as his does, and his two
ways of running layers (all frames at once with a zero-padded memory; a work queue frame by frame)."""

from __future__ import annotations

import re
from collections import deque

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainer.families import FAMILIES, family_from_name
from trainer.model import TAEHV, WeightsError
from trainer.streaming import stream_decode, stream_encode

# ----------------------------------------------------------------------------- the reference


def _c3(n_in: int, n_out: int, **kw: object) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, **kw)  # type: ignore[arg-type]


class RefClamp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 3 * torch.tanh(x / 3)


class RefMem(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.conv = nn.Sequential(_c3(2 * n, n), nn.ReLU(), _c3(n, n), nn.ReLU(), _c3(n, n))
        self.skip = nn.Identity()
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(torch.cat([x, past], 1)) + self.skip(x))


class RefSuperMem(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(2 * n, 2 * n, 7, padding=3, groups=2 * n, bias=False),
            nn.Conv2d(2 * n, 4 * n, 1),
            nn.ReLU(),
            nn.Conv2d(4 * n, n, 1, bias=False),
        )

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        return x + self.conv(torch.cat([x, past], 1))


class RefPool(nn.Module):
    def __init__(self, n: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n * stride, n, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.reshape(-1, self.stride * x.shape[1], *x.shape[2:]))


class RefGrow(nn.Module):
    def __init__(self, n: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n, n * stride, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).reshape(-1, *x.shape[1:])


def _ref_parallel(layers: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    x = x.flatten(0, 1)
    for layer in layers:
        if isinstance(layer, (RefMem, RefSuperMem)):
            v = x.unflatten(0, (n, -1))
            past = F.pad(v, (0, 0, 0, 0, 0, 0, 1, 0))[:, :-1].flatten(0, 1)
            x = layer(x, past)
        else:
            x = layer(x)
    return x.unflatten(0, (n, -1))


class RefQueue:
    """The work queue: frames enter at layer 0 and go as deep as they can; memory per layer."""

    def __init__(self, layers: nn.Sequential):
        self.layers = layers
        self.memory: list[object] = [None] * len(layers)

    def feed(self, frames: list[torch.Tensor]) -> list[torch.Tensor]:
        queue, out = deque((f, 0) for f in frames), []
        while queue:
            x, i = queue.popleft()
            if i == len(self.layers):
                out.append(x)
                continue
            layer = self.layers[i]
            if isinstance(layer, (RefMem, RefSuperMem)):
                past = self.memory[i]
                self.memory[i] = x
                queue.appendleft((layer(x, torch.zeros_like(x) if past is None else past), i + 1))
            elif isinstance(layer, RefPool):
                held = (self.memory[i] or []) + [x]  # type: ignore[operator]
                self.memory[i] = held
                if len(held) == layer.stride:
                    self.memory[i] = []
                    queue.appendleft((layer(torch.stack(held, 1).flatten(0, 1)), i + 1))
            elif isinstance(layer, RefGrow):
                grown = layer(x).unflatten(0, (x.shape[0], layer.stride)).unbind(1)
                queue.extendleft((g, i + 1) for g in reversed(grown))
            else:
                queue.appendleft((layer(x), i + 1))
        return out


class AuthorTAE(nn.Module):
    """The author's class as its conventions are published: shapes from substrings of the weight
    path, strict torch.load(weights_only=True) loading."""

    def __init__(self, checkpoint_path: str):
        super().__init__()
        p, lc, enc_t, dec_t = 1, 16, (True, True, False), (False, True, True)
        self.is_cogvideox = "taecvx" in checkpoint_path
        self.is_h3 = "taeh3" in checkpoint_path
        if "taew2_2" in checkpoint_path:
            p, lc = 2, 48
        if "taehv1_5" in checkpoint_path:
            p, lc = 2, 32
        if self.is_h3:
            p, lc = 2, 24
        if "taeltx" in checkpoint_path:
            p, lc, enc_t, dec_t = 4, 128, (True, True, True), (True, True, True)
        self.patch_size, self.latent_channels = p, lc
        enc: list[nn.Module] = [_c3(3 * p * p, 64), nn.ReLU()]
        for t in enc_t:
            enc += [
                RefPool(64, 2 if t else 1),
                _c3(64, 64, stride=2, bias=False),
                *(RefMem(64) for _ in range(3)),
            ]
        self.encoder = nn.Sequential(*enc, _c3(64, lc))
        dec: list[nn.Module]
        if "_super" in checkpoint_path:
            dec = [nn.Conv2d(lc, 512, 1, bias=False)]
            for n, nxt, t in zip((512, 256, 128), (256, 128, 64), dec_t):
                dec += [*(RefSuperMem(n) for _ in range(3)), _c3(n, nxt * 4), nn.ReLU(), nn.PixelShuffle(2)]
                dec.append(RefGrow(nxt, 2 if t else 1))
            dec.append(_c3(64, 3 * p * p))
        else:
            dec = [RefClamp(), _c3(lc, 256), nn.ReLU()]
            for n, nxt, t in zip((256, 128, 64), (128, 64, 64), dec_t):
                dec += [
                    *(RefMem(n) for _ in range(3)),
                    nn.Upsample(scale_factor=2),
                    RefGrow(n, 2 if t else 1),
                ]
                dec.append(_c3(n, nxt, bias=False))
            dec += [nn.ReLU(), _c3(64, 3 * p * p)]
        self.decoder = nn.Sequential(*dec)
        self.t_down, self.t_up = 2 ** sum(enc_t), 2 ** sum(dec_t)
        self.load_state_dict(torch.load(checkpoint_path, map_location="cpu", weights_only=True))

    def _encode(self, x: torch.Tensor, parallel: bool) -> torch.Tensor:
        if self.patch_size > 1:
            x = F.pixel_unshuffle(x.flatten(0, 1), self.patch_size).unflatten(0, x.shape[:2])
        if parallel:
            return _ref_parallel(self.encoder, x)
        return torch.stack(RefQueue(self.encoder).feed(list(x.unbind(1))), 1)

    def encode_video(self, x: torch.Tensor, parallel: bool) -> torch.Tensor:
        quantum = 17 if self.is_h3 else self.t_down
        if x.shape[1] % quantum:
            x = torch.cat([x, x[:, -1:].repeat_interleave(quantum - x.shape[1] % quantum, 1)], 1)
        if not self.is_h3:
            return self._encode(x, parallel)
        chunks = [torch.cat([torch.zeros_like(c[:, :3]), c], 1) for c in x.split(17, 1)]
        return torch.cat([self._encode(c, parallel) for c in chunks], 1)[:, :-3]

    def _post(self, x: torch.Tensor) -> torch.Tensor:
        if self.patch_size > 1:
            x = F.pixel_shuffle(x.flatten(0, 1), self.patch_size).unflatten(0, x.shape[:2])
        return x.clamp(0, 1)

    def decode_video(self, z: torch.Tensor, parallel: bool) -> torch.Tensor:
        if self.is_h3:  # memory carried across; the first 3 frames of each 20-frame chunk dropped
            if parallel:  # all latents at once, then cut into chunks
                chunks = self._post(_ref_parallel(self.decoder, z)).split(20, 1)
            else:  # 5-latent chunks through one queue
                queue = RefQueue(self.decoder)
                chunks = tuple(
                    self._post(torch.stack(queue.feed(list(c.unbind(1))), 1)) for c in z.split(5, 1)
                )
            return torch.cat([c[:, 3:] for c in chunks], 1)
        if parallel:
            x = _ref_parallel(self.decoder, z)
        else:
            x = torch.stack(RefQueue(self.decoder).feed(list(z.unbind(1))), 1)
        x = self._post(x)
        if self.is_cogvideox and z.shape[1] % 2 == 0:
            return x
        return x[:, self.t_up - 1 :]


# ----------------------------------------------------------------------------- the checks


def _random_weights(model: TAEHV) -> TAEHV:
    # the init zeroes each memory block's last conv (identity start), which would hide a wrong past
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (1.0 / max(p[0].numel(), 1)) ** 0.5)
    return model


# frames per clip: past the chunk/latent edges each family has
CLIPS = {
    "taeh3": (34,),  # two 17-frame chunks (10 latents, 3 dropped: 7: the 5-latent decode chunks of 5 + 2)
    "taecvx": (16, 12),  # 4 latents (even: nothing trimmed) and 3 (odd: 3 trimmed)
    "taeltx_2": (16, 17),  # 2 latents -> 16 frames less 7; 17 pads to 24
    "taeltx2_3": (16,),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_computes_what_the_authors_class_computes(name, tmp_path):
    fam = FAMILIES[name]
    model = _random_weights(TAEHV.for_family(name)).double().eval()
    path = tmp_path / f"{name}.pth"
    torch.save(model.state_dict(), path)
    ref = AuthorTAE(str(path)).double().eval()  # strict: the author's names and shapes, by name alone
    size = 8 * fam.patch_size
    torch.manual_seed(0)
    for frames in CLIPS.get(name, (8,)):
        x = torch.rand(2, frames, 3, size, size, dtype=torch.float64)
        with torch.no_grad():
            z_ref = ref.encode_video(x, parallel=True)
            z = model.encode(x)
            torch.testing.assert_close(z, z_ref, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(
                stream_encode(model, x), ref.encode_video(x, parallel=False), rtol=1e-9, atol=1e-9
            )
            y_ref = ref.decode_video(z_ref, parallel=True)
            y = model.decode(z)
            assert y.shape == y_ref.shape, (frames, y.shape, y_ref.shape)
            assert 0.05 < ((y > 0) & (y < 1)).double().mean()  # not all clamped away
            torch.testing.assert_close(y, y_ref, rtol=1e-9, atol=1e-9)
            y_seq = ref.decode_video(z_ref, parallel=False)
            torch.testing.assert_close(stream_decode(model, z), y_seq, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(model.decode(z, trim=False)[:, model.kept_frames(z.shape[1])], y)
            short = x[:, : frames - 5]  # padded at the end to the family's quantum (H3: 17 frames)
            torch.testing.assert_close(
                model.encode(short), ref.encode_video(short, parallel=True), rtol=1e-9, atol=1e-9
            )


def test_frame_counts_per_family():
    counts = {}
    for name in ("taehv", "taecvx", "taeltx_2", "taeh3"):
        m = TAEHV.for_family(name)
        counts[name] = [len(torch.arange(m.t_upscale * k)[m.kept_frames(k)]) for k in (2, 3, 7)]
    assert counts["taehv"] == [5, 9, 25]
    assert counts["taecvx"] == [8, 9, 25]  # an even count keeps every frame
    assert counts["taeltx_2"] == [9, 17, 49]  # 1 + 8(k-1)
    assert counts["taeh3"][2] == 22  # 7 latents: 17 + 5 frames (17·1 + 5 <-> 5·1 + 2 latents)


def test_family_names_follow_the_authors_substring_order():
    assert family_from_name("taecvx.pth") == "taecvx"
    assert family_from_name("my_taew2_2_super_ema.safetensors") == "taew2_2_super"
    assert family_from_name("taeltx2_3.pth") == "taeltx2_3" and family_from_name("taeltx_2.pth") == "taeltx_2"
    assert family_from_name("taehv1_5.pth") == "taehv1_5" and family_from_name("taehv.pth") == "taehv"
    assert family_from_name("weights.safetensors") is None
    assert family_from_name("taecvx_super.pth") is None  # no such decoder


def test_from_file_reads_metadata_then_name_then_shapes(tmp_path):
    from safetensors.torch import save_file

    sd = TAEHV.for_family("taehv1_5_super").state_dict()
    save_file(sd, str(tmp_path / "anything.safetensors"), metadata={"family": "taehv1_5_super"})
    assert TAEHV.from_file(tmp_path / "anything.safetensors").family == "taehv1_5_super"
    torch.save(sd, tmp_path / "plain.pth")  # no metadata, no name: the shapes fit one family
    assert TAEHV.from_file(tmp_path / "plain.pth").family == "taehv1_5_super"
    torch.save(TAEHV.for_family("taew2_1").state_dict(), tmp_path / "w.pth")
    with pytest.raises(WeightsError, match="taehv, taew2_1, taecvx"):
        TAEHV.from_file(tmp_path / "w.pth")  # HunyuanVideo, Wan 2.1 and CogVideoX share shapes
    (tmp_path / "w.pth").rename(tmp_path / "taew2_1.pth")
    assert TAEHV.from_file(tmp_path / "taew2_1.pth").family == "taew2_1"
    (tmp_path / "plain.pth").rename(tmp_path / "taew2_2.pth")  # named for another family: strict
    with pytest.raises(WeightsError, match="taew2_2.pth"):
        TAEHV.from_file(tmp_path / "taew2_2.pth")


def test_time_upscaling_off_keeps_the_last_timestep_channels(tmp_path):
    full = _random_weights(TAEHV.for_family("taew2_1"))
    torch.save(full.state_dict(), tmp_path / "taew2_1.pth")
    preview = TAEHV.from_file(tmp_path / "taew2_1.pth", decoder_time_upscale=(False, False, False))
    for i in (13, 19):  # the two stride-2 TGrows: 2n channels in the file, n in the preview
        kept = preview.decoder[i].conv.weight
        assert torch.equal(kept, full.decoder[i].conv.weight[-kept.shape[0] :])
    with torch.no_grad():
        assert preview.decode(torch.randn(1, 3, 16, 2, 2)).shape[1] == 3  # one frame per latent


@pytest.mark.parametrize("name", ["taew2_2_super", "taeh3"])
def test_faster_run_and_channels_last_equal_the_published_order(name):
    """The super decoder and H3's chunks run on the same stages as the base model: the reordered,
    channels_last run gives the published order's outputs and gradients."""
    fast = _random_weights(TAEHV.for_family(name)).double().train().use_channels_last()
    plain = TAEHV.for_family(name).double().train().use_published_order()
    plain.load_state_dict(fast.state_dict())
    size = 8 * fast.patch_size
    x = torch.rand(2, 17 if fast.chunks else 8, 3, size, size, dtype=torch.float64)
    grads = []
    for m in (fast, plain):
        m.zero_grad()
        z, y = m(x, clamp=False)
        ((y - x[:, : y.shape[1]]) ** 2).mean().backward()
        grads.append((z.detach(), y.detach(), {k: p.grad.clone() for k, p in m.named_parameters()}))
    (z1, y1, g1), (z2, y2, g2) = grads
    torch.testing.assert_close(z1, z2, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(y1, y2, rtol=1e-9, atol=1e-9)
    for k in g1:
        torch.testing.assert_close(g1[k], g2[k], rtol=1e-8, atol=1e-9, msg=k)


def test_exported_files_load_by_name_into_the_authors_class(tmp_path):
    from trainer.checkpointing import write_exported
    from trainer.families import exported_files

    assert exported_files("taehv") == ("taehv.safetensors", "taehv_ema.safetensors")  # as before families
    assert exported_files("custom")[0] == "taehv.safetensors"
    for name in ("taew2_2_super", "taeltx_2"):
        src = _random_weights(TAEHV.for_family(name))
        weights, _ema = exported_files(name)
        assert weights == f"{name}.safetensors"
        write_exported(src.state_dict(), tmp_path / weights, {"family": name, "run": "r1"})
        pth = tmp_path / f"{name}.pth"
        ref = AuthorTAE(str(pth))  # torch.load(weights_only=True), strict, shapes from the name alone
        assert all(torch.equal(a, b) for a, b in zip(ref.state_dict().values(), src.state_dict().values()))
        (tmp_path / weights).rename(tmp_path / "renamed.safetensors")  # the metadata still says it
        assert TAEHV.from_file(tmp_path / "renamed.safetensors").family == name


def test_the_family_sets_the_shapes_and_a_contradiction_names_both():
    from trainer.config import ConfigError, ModelSection, config_from_dict

    assert ModelSection().family == "taehv"
    ltx = ModelSection(family="taeltx_2")
    assert (ltx.latent_channels, ltx.patch_size, ltx.encoder_time_downscale) == (128, 4, (True, True, True))
    assert (
        ModelSection(latent_channels=48, patch_size=2).family == "taew2_2"
    )  # a [model] from before families
    assert ModelSection(latent_channels=32).family == "custom"  # shapes of no family stand as written
    with pytest.raises(
        ConfigError, match=r"model.latent_channels = 16 contradicts model.family = taew2_2, which has 48"
    ):
        config_from_dict({"model": {"family": "taew2_2", "latent_channels": 16}})
    with pytest.raises(ConfigError, match="unknown family 'taew3'; known: taehv, taew2_1, .*taeh3"):
        config_from_dict({"model": {"family": "taew3"}})


def test_set_family_replaces_the_presets_shapes():
    from taehv_console.core.plan.presets import load_preset

    cfg = load_preset("cpu-smoke", overrides=["model.family=taehv1_5"], user_dir=None).config
    assert (cfg.model.family, cfg.model.latent_channels, cfg.model.patch_size) == ("taehv1_5", 32, 2)


@pytest.mark.parametrize(
    "family, data, words",
    [
        (
            "taehv",
            {"frames": 10},
            "data.frames: must be a multiple of 4 .* got 10; the nearest lengths that work: 8 or 12",
        ),
        (
            "taeh3",
            {"frames": 16},
            "data.frames: must be a multiple of 17 .*17-frame chunks.* 16; .*work: 17$",
        ),
        ("taeh3", {"frames": 12}, "data.frames: .* 12; the nearest lengths that work: 17$"),
        ("taeltx_2", {"frames": 12}, "data.frames: must be a multiple of 8 .*time 8x.* 12; .*work: 8 or 16"),
        ("taew2_2", {"height": 40}, "data.height: must be a multiple of 16 .*8 x patch 2.* 40; .*: 32 or 48"),
        (
            "taeltx2_3",
            {"frames": 8, "width": 720},
            "data.width: must be a multiple of 32 .*8 x patch 4.*: 704 or 736",
        ),
    ],
)
def test_a_clip_the_family_cannot_encode_exactly_names_the_lengths_that_work(family, data, words):
    """The clip rule is the family's: taehv's multiple of 4 stands, H3 needs 17·n frames and LTX 8·n,
    a crop is in whole 8·p pixels; the error says the nearest that work, beside any other error."""
    from trainer.config import ConfigError, TrainConfig, config_from_dict

    raw = {"model": {"family": family}, "data": {"height": 64, "width": 64, **data}, "optim": {"lr": -1}}
    with pytest.raises(ConfigError) as err:
        config_from_dict(raw, "run.toml")
    lines = str(err.value).splitlines()
    assert any(re.search(words, line) for line in lines), lines
    assert any(line.startswith("  optim.lr:") for line in lines)  # collected, not first-only
    with pytest.raises(ValueError, match=words.split(" .*")[0]):  # without the context too
        TrainConfig.model_validate({**raw, "optim": {}})


@pytest.mark.parametrize(
    "family, frames, size", [("taehv", 8, 8), ("taeh3", 34, 32), ("taeltx_2", 16, 64), ("taecvx", 12, 24)]
)
def test_each_familys_own_lengths_and_crops_validate(family, frames, size):
    from trainer.config import config_from_dict

    cfg = config_from_dict(
        {"model": {"family": family}, "data": {"frames": frames, "height": size, "width": size}}
    )
    assert (cfg.model.family, cfg.data.frames) == (family, frames)
