"""Each family distils from its own teacher: a tiny random instance of the family's diffusers class
(tests/trainer/teachers.py), loaded through the loader a run uses. No DeepSpeed run: the loader, the
teacher's encode and decode, and the student's, called directly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from trainer.families import FAMILIES, get_family, teacher_frames
from trainer.model import TAEHV, reconstruction_target
from trainer.teacher import (
    TeacherError,
    encode,
    load_teacher,
    place_teacher,
    teacher_decoded_frames,
    teacher_pixels,
)
from trainer.teacher_geometry import auto_model, geometry_of

# per family: a clip length with 3 latents' worth of time (H3: two 17-frame chunks, 7 latents), and
# CogVideoX once more at an even latent count, where nothing is trimmed
CLIPS = [(f, 34 if f == "taeh3" else 3 * FAMILIES[f].time_scale) for f in FAMILIES] + [("taecvx", 8)]


@pytest.mark.parametrize(("family", "frames"), CLIPS, ids=[f"{f}-{t}f" for f, t in CLIPS])
def test_each_family_encodes_with_its_own_teacher_as_its_student_does(tiny_teachers, family, frames):
    """The class comes from config.json; the latents of a clip of the family's length are exactly the
    student's (count, channels, cells); the student's decode of them is as long as the teacher's own
    decode, and stands for the input frames [0, n) the loss compares (CogVideoX's even latent counts:
    all T, which its teacher encodes whole)."""
    fam = get_family(family)
    directory = tiny_teachers(family)
    geometry = geometry_of(directory)
    assert family in geometry.families() and geometry.class_name == fam.teacher_class
    teacher = load_teacher(directory, latent_channels=fam.latent_channels, family=family)
    assert type(teacher).__name__ == fam.teacher_class

    s = fam.space_scale
    torch.manual_seed(0)
    x = torch.rand(1, frames, 3, 2 * s, 2 * s)
    student = TAEHV.for_family(family).eval()
    with torch.no_grad():
        lat = encode(teacher, x, family)
        assert lat.shape == student.encode(x).shape
        k = lat.shape[1]
        assert lat.shape == (1, k, fam.latent_channels, 2, 2)
        assert k == (5 * frames // 17 - 3 if fam.chunks else frames // fam.time_scale)
        decoded = student.decode(lat)
        own = teacher_decoded_frames(teacher, teacher.decode(lat.permute(0, 2, 1, 3, 4)).sample)
    n = decoded.shape[1]
    if fam.chunks:  # H3: the last 12 frames of the padded chunks, as the teacher's own decode
        assert n == frames - 12 == own.shape[1]
    elif fam.untrimmed_even_latents and k % 2 == 0:  # CogVideoX's 8m frames: pooled evenly, all kept
        assert n == frames == teacher_frames(family, frames) == own.shape[1]
    else:  # a causal 1 + t·k VAE: the teacher saw frames [0, T - (t - 1)) and decodes as many
        assert n == frames - (fam.time_scale - 1) == teacher_frames(family, frames) == own.shape[1]
    assert reconstruction_target(x, n).shape == decoded.shape
    assert own.shape[2:] == x.shape[2:] and 0 <= float(own.min()) <= float(own.max()) <= 1


def test_h3_takes_imagenet_pixels_and_chunks_the_clip_itself(tiny_teachers):
    """diffusers' AutoencoderKLMiniMaxH3 pads to 17-frame chunks and drops the last 3 latents in its own
    encode (so its teacher sees all T frames), and takes ImageNet-normalised pixels, not [-1, 1]."""
    teacher = load_teacher(tiny_teachers("taeh3"), latent_channels=24, family="taeh3")
    x = torch.rand(1, 17, 3, 32, 32)
    pixels = teacher_pixels(teacher, x)
    mean = torch.tensor((0.485, 0.456, 0.406)).view(1, 3, 1, 1, 1)
    std = torch.tensor((0.229, 0.224, 0.225)).view(1, 3, 1, 1, 1)
    assert torch.allclose(pixels, (x.permute(0, 2, 1, 3, 4) - mean) / std)
    with torch.no_grad():
        assert encode(teacher, x, "taeh3").shape[1] == 5 - 3


def test_a_bf16_teacher_keeps_what_its_class_pins_to_float32(tiny_teachers):
    """The teacher runs in bf16 on a bf16 run and in cache-latents on a GPU; H3's class pins its
    encoder, quant_conv and norms to float32 (_keep_in_fp32_modules), as from_pretrained(torch_dtype=)
    would keep them, and casts its input to the encoder's dtype itself."""
    import diffusers

    path = tiny_teachers("taeh3")
    teacher = place_teacher(load_teacher(path, latent_channels=24, family="taeh3"), "cpu", torch.bfloat16)
    theirs = diffusers.AutoencoderKLMiniMaxH3.from_pretrained(str(path), torch_dtype=torch.bfloat16)
    ours = {n: t.dtype for n, t in teacher.named_parameters()}
    assert ours == {n: t.dtype for n, t in theirs.named_parameters()}
    assert {torch.float32, torch.bfloat16} <= set(ours.values())  # some pinned, the rest bf16
    assert all(t.dtype == torch.float32 for n, t in teacher.named_parameters() if n.startswith("encoder."))
    with torch.no_grad():
        z = encode(teacher, torch.rand(1, 17, 3, 32, 32), "taeh3")
    assert z.shape[1] == 5 - 3 and torch.isfinite(z.float()).all()
    # a class that pins nothing is cast whole
    wan = place_teacher(
        load_teacher(tiny_teachers("taew2_1"), latent_channels=16, family="taew2_1"), "cpu", torch.bfloat16
    )
    assert {t.dtype for t in wan.parameters()} == {torch.bfloat16}


# per class: config.json edits that change its latent channels, space or time compression
DEVIANT = {
    "taehv": {
        "channels": {"latent_channels": 8},
        "space": {"spatial_compression_ratio": 16},
        "time": {"temporal_compression_ratio": 8},
    },
    "taew2_1": {
        "channels": {"z_dim": 8},
        "space": {"dim_mult": [1, 2, 2, 2, 2], "temperal_downsample": [False, True, True, False]},
        "time": {"temperal_downsample": [False, False, True]},
    },
    "taew2_2": {
        "channels": {"z_dim": 16},
        "space": {"patch_size": 4},
        "time": {"temperal_downsample": [True] * 3},
    },
    "taehv1_5": {
        "channels": {"latent_channels": 16},
        "space": {"spatial_compression_ratio": 32},
        "time": {"temporal_compression_ratio": 8},
    },
    "taecvx": {
        "channels": {"latent_channels": 8},
        "space": {"block_out_channels": [8, 8, 16, 16, 16]},
        "time": {"temporal_compression_ratio": 2},
    },
    "taeltx_2": {
        "channels": {"latent_channels": 64},
        "space": {"patch_size": 2},
        "time": {"patch_size_t": 2},
    },
    "taeh3": {
        "channels": {"latent_channels": 16},
        "space": {"spatial_downsample_factors": [2, 2, 2, 2, 2, 1]},
        "time": {"temporal_downsample_factors": [1, 2, 2, 2, 1, 1]},
    },
}
# another family for each teacher, of other shapes or of another class
OTHER = {
    "taehv": "taew2_1",
    "taew2_1": "taecvx",
    "taew2_2": "taehv1_5",
    "taehv1_5": "taeh3",
    "taecvx": "taehv",
    "taeltx_2": "taew2_2",
    "taeh3": "taew2_2",
}


@pytest.mark.parametrize("family", list(DEVIANT))
def test_a_teacher_of_another_shape_or_family_is_refused_naming_the_family_it_fits(
    tiny_teachers, tmp_path, family
):
    """Before any weight is read: the family's own teacher given to another family names the family it
    fits; a teacher of the same class whose latent channels, space or time compression differ from
    the family's is refused naming what it is, and which family (or none) fits it."""
    directory = tiny_teachers(family)
    fam, other = get_family(family), get_family(OTHER[family])
    with pytest.raises(TeacherError) as err:
        load_teacher(directory, latent_channels=other.latent_channels, family=other.name)
    text = str(err.value)
    assert f"the teacher is {fam.teacher_class}" in text and f"model.family = {other.name} needs" in text
    assert f"it fits model.family = {family}" in text, text

    config = json.loads((directory / "config.json").read_text())
    for what, edits in DEVIANT[family].items():
        bent = tmp_path / what
        bent.mkdir()
        (bent / "config.json").write_text(json.dumps({**config, **edits}))
        for weights in directory.glob("*.safetensors"):
            shutil.copy(weights, bent / weights.name)  # refused on config.json alone, before loading
        with pytest.raises(TeacherError) as err:
            load_teacher(bent, latent_channels=fam.latent_channels, family=family)
        text = str(err.value)
        assert f"the teacher is {fam.teacher_class}" in text and f"model.family = {family} needs" in text
        assert "fits" in text, text
        geometry = geometry_of(bent)
        assert geometry.families() != [family] and family not in geometry.families()
        shown = {
            "channels": geometry.latent_channels,
            "space": geometry.space_scale,
            "time": geometry.time_scale,
        }
        own = {"channels": fam.latent_channels, "space": fam.space_scale, "time": fam.time_scale}
        assert shown[what] != own[what] and all(shown[k] == own[k] for k in own if k != what)


def test_auto_derives_the_student_from_the_teacher(tiny_teachers, tmp_path):
    """A published family's teacher gives that family; a video VAE of 8·p space and 4x or 8x time that
    no family has gives `custom` shapes; anything else is refused with why."""
    assert auto_model(geometry_of(tiny_teachers("taew2_2")))["family"] == "taew2_2"
    assert auto_model(geometry_of(tiny_teachers("taeltx2_3")))["family"] == "taeltx_2"
    config = json.loads((tiny_teachers("taew2_1") / "config.json").read_text())
    (tmp_path / "config.json").write_text(
        json.dumps({**config, "z_dim": 12, "temperal_downsample": [True] * 3})
    )
    assert auto_model(geometry_of(tmp_path)) == {
        "family": "custom",
        "latent_channels": 12,
        "patch_size": 1,
        "encoder_time_downscale": (True, True, True),
        "decoder_time_upscale": (True, True, True),
    }
    (tmp_path / "config.json").write_text(json.dumps({**config, "temperal_downsample": [False, False, True]}))
    with pytest.raises(TeacherError, match=r"model.family = auto: .* 2x time is neither 4x nor 8x"):
        auto_model(geometry_of(tmp_path))


def test_the_latent_cache_of_a_patch_2_family_crops_on_its_16_pixel_cell(tiny_teachers, tmp_path):
    """cache-latents with Wan 2.2's teacher (taew2_2, 8·p = 16): the canvas must be whole 16-pixel
    cells, the manifest records the cell, and a training crop moves in whole cells, so its latents are
    exactly the slice of the canvas's."""
    from tests.trainer.runs import base_config
    from trainer.config import config_from_dict
    from trainer.data import find_videos, read_frames
    from trainer.latent_cache import CachedLatentDataset, CacheError, build_cache, open_cache, to_canvas
    from trainer.synthetic import make_synthetic

    clips = tmp_path / "clips"
    make_synthetic(clips, clips=2, frames=8, height=48, width=64, seed=5)
    teacher, cache = tiny_teachers("taew2_2"), tmp_path / "cache"
    cfg = config_from_dict(
        base_config(
            clips,
            model={"family": "taew2_2"},
            loss={"teacher": str(teacher), "teacher_cache": str(cache)},
        )
    )
    with pytest.raises(
        CacheError, match=r"40x40: both sides must be multiples of 16 \(model.family = taew2_2"
    ):
        build_cache(cfg, cache, height=40, width=40, log=lambda _m: None)
    assert build_cache(cfg, cache, height=48, width=48, max_windows=1, log=lambda _m: None)["manifest"]
    manifest = open_cache(cache, cfg)
    assert manifest["latent_cell"] == 16 and manifest["family"] == "taew2_2"

    ds = CachedLatentDataset(cache, manifest, find_videos(str(clips)), cfg.data)
    canvas = to_canvas(read_frames(Path(ds.clips[0]["path"]), list(range(8))), 48, 48)
    lat = encode(
        load_teacher(teacher, latent_channels=48, family="taew2_2"), canvas[None].float() / 255, "taew2_2"
    )
    offsets = set()
    for seed in range(12):
        item = ds[(0, seed)]
        assert item["latents"].shape == (2, 48, 2, 2)
        (t, l), *_ = [
            (t, l)
            for t in range(17)
            for l in range(17)
            if torch.equal(canvas[:, :, t : t + 32, l : l + 32], item["video"])
        ]
        assert t % 16 == 0 and l % 16 == 0, (t, l)
        offsets.add((t, l))
        expect = lat[0, :, :, t // 16 : t // 16 + 2, l // 16 : l // 16 + 2]
        torch.testing.assert_close(item["latents"], expect.half().float())
    assert len(offsets) > 1  # crops at more than one cell


def test_model_family_auto_is_resolved_at_config_load_and_the_cli_names_what_cannot_be_served(
    tiny_teachers, tmp_path, capsys
):
    """`model.family = auto` reads loss.teacher's config.json when the config is read: Wan 2.2's VAE
    gives taew2_2 and a run.toml naming it; a VAE of 8·p space and 8x time that no family has gives
    `custom` shapes of its latents; a knob that contradicts the teacher, no teacher, or one of 2x time
    are errors, and through the CLI (`plan`) one line and exit 2 (usage), no traceback."""
    from taehv_console.cli import main
    from tests.trainer.runs import base_config
    from trainer.config import ConfigError, config_from_dict, config_to_toml

    def cfg(teacher, **model):
        return config_from_dict(
            base_config(tmp_path, model={"family": "auto", **model}, loss={"teacher": str(teacher)})
        )

    published = cfg(tiny_teachers("taew2_2"))
    assert (published.model.family, published.model.latent_channels, published.model.patch_size) == (
        "taew2_2",
        48,
        2,
    )
    assert 'family = "taew2_2"' in config_to_toml(published)

    config = json.loads((tiny_teachers("taew2_1") / "config.json").read_text())
    custom, bad = tmp_path / "custom", tmp_path / "bad"
    for directory, edits in (
        (custom, {"z_dim": 12, "temperal_downsample": [True, True, True]}),
        (bad, {"temperal_downsample": [False, False, True]}),
    ):
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps({**config, **edits}))
    m = cfg(custom).model
    assert (m.family, m.latent_channels, m.patch_size, m.encoder_time_downscale) == (
        "custom",
        12,
        1,
        (True,) * 3,
    )
    assert cfg(custom).clip_rule.frame_quantum == 8

    with pytest.raises(
        ConfigError, match=r"model.latent_channels = 16 contradicts model.family = auto.* gives 12"
    ):
        cfg(custom, latent_channels=16)
    with pytest.raises(ConfigError, match="model.family = auto derives the student .* loss.teacher is empty"):
        cfg("")
    with pytest.raises(ConfigError, match=r"no student serves it: 2x time is neither 4x nor 8x"):
        cfg(bad)

    argv = ["plan", "--preset", "cpu-smoke", "--set", "model.family=auto", "--set", f"loss.teacher={bad}"]
    assert main(argv) == 2
    out = capsys.readouterr()
    text = out.out + out.err
    assert (
        "model.family = auto: the teacher is AutoencoderKLWan with 16 latent channels, 8x space, 2x time"
        in text
    )
    assert "Traceback" not in text and text.count("model.family = auto:") == 1
