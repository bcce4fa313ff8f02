"""`eval`'s scoring engine on real generated videos and real models: its figures match a direct
computation, a trained model scores above an untrained one, the temporal figure sees flicker that
PSNR misses, streaming gives parallel's figures on a long clip, and bad input names the file."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

from tests.trainer.runs import write_run
from trainer.config import DataSection
from trainer.data import VideoClipDataset, find_videos
from trainer.eval_report import result_dict, write_report
from trainer.evaluate import EvalError, architecture, figures, load_model, resolve_weights, score
from trainer.model import TAEHV, WeightsError
from trainer.streaming import stream_forward
from trainer.synthetic import make_synthetic, write_video
from trainer.teacher import TeacherError

# taehv's shapes are taew2_1's and taecvx's too: the family in the header, as the trainer exports it
TAEHV_META = {"family": "taehv"}
SIZE = 32  # small clips: the machine running the tests may be a couple of shared CPU cores


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("eval-clips")
    make_synthetic(d, clips=3, frames=16, height=SIZE, width=SIZE, seed=3)
    return d


def read_clip(path, frames: int = 12) -> torch.Tensor:
    """A clip as eval reads it (validation's way: first frames, whole frame at this size)."""
    cfg = DataSection(frames=frames, height=SIZE, width=SIZE)
    return VideoClipDataset([path], cfg, train=False)[0]["video"].float() / 255


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("untrained") / "untrained.safetensors"
    save_file(TAEHV().state_dict(), str(path), metadata=TAEHV_META)
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory, clips):
    """A few Adam steps of plain reconstruction training on two of the clips (no DeepSpeed)."""
    torch.manual_seed(0)
    model = TAEHV()
    x = torch.stack([read_clip(p, 8) for p in find_videos(str(clips))[:2]])
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(15):
        _z, y = model(x, clamp=False)
        loss = torch.mean((y - x[:, : y.shape[1]]) ** 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    path = tmp_path_factory.mktemp("trained") / "trained.safetensors"
    save_file(model.state_dict(), str(path), metadata=TAEHV_META)
    return path


def direct_psnr(a: np.ndarray, b: np.ndarray) -> float:
    return 10 * math.log10(1 / np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))


def test_figures_match_a_direct_computation(clips, untrained, tmp_path):
    result = score(resolve_weights(untrained), str(clips), device="cpu")
    report = write_report(result, tmp_path / "out")
    assert report["frames"] == 12 and report["scored_frames"] == 9  # 4k frames decode to 4k-3
    assert (report["height"], report["width"]) == (SIZE, SIZE), "whole frames without a run"
    assert (
        "inferred" in report["models"][0]["config"] and "latent_channels=16" in report["models"][0]["config"]
    )

    model = TAEHV()
    model.load_state_dict(load_file(str(untrained)))
    model.eval()
    psnrs = []
    for clip, path in zip(report["clips"], find_videos(str(clips))):
        assert clip["source"] == str(path)
        x = read_clip(path)
        with torch.no_grad():
            y = model(x[None])[1][0].numpy()
        t = x[: y.shape[0]].numpy()
        got = clip["models"][0]
        assert got["psnr"] == pytest.approx(direct_psnr(t, y), abs=1e-3)
        dx, dy = np.diff(t.astype(np.float64), axis=0), np.diff(y.astype(np.float64), axis=0)
        assert got["temporal_mse"] == pytest.approx(np.mean((dy - dx) ** 2), rel=1e-4)
        assert got["temporal_psnr"] == pytest.approx(10 * math.log10(1 / np.mean((dy - dx) ** 2)), abs=1e-3)
        assert 0 < got["ssim"] < 1
        assert clip["mid_grey"]["psnr"] == pytest.approx(direct_psnr(t, np.full_like(t, 0.5)), abs=1e-3)
        mean = t.mean(axis=(0, 2, 3), keepdims=True)
        assert clip["mean_colour"]["psnr"] == pytest.approx(
            direct_psnr(t, np.broadcast_to(mean, t.shape)), abs=1e-3
        )
        assert clip["mean_colour"]["psnr"] > clip["mid_grey"]["psnr"]
        psnrs.append(got["psnr"])
    assert report["models"][0]["overall"]["psnr"] == pytest.approx(sum(psnrs) / len(psnrs))

    assert json.loads((tmp_path / "out" / "eval-untrained.json").read_text()) == report
    sheet = np.asarray(Image.open(report["contact_sheet"]))
    # 3 clips of 3 rows (input, reconstruction, error), 4-pixel bands between; 8 of the 9 frames
    assert sheet.shape == (3 * 3 * SIZE + 2 * 4, 8 * SIZE, 3)


def test_compare_orders_a_trained_model_above_an_untrained_one(clips, trained, untrained):
    report = result_dict(score(resolve_weights(trained), str(clips), compare=resolve_weights(untrained)))
    (a, b) = report["models"]
    assert (a["label"], b["label"]) == ("trained", "untrained")
    assert a["overall"]["psnr"] > b["overall"]["psnr"] + 2, (a["overall"], b["overall"])
    assert a["overall"]["temporal_psnr"] > b["overall"]["temporal_psnr"]
    assert all(c["models"][0]["psnr"] > c["models"][1]["psnr"] for c in report["clips"])


def test_temporal_figure_sees_flicker_that_psnr_does_not():
    x = read_clip_like_noise()
    steady = x + 0.05  # every frame 0.05 too bright
    flicker = x + 0.05 * torch.tensor([1.0, -1.0]).repeat(6)[:, None, None, None]  # ±0.05, frame by frame
    a, b = figures(x, steady), figures(x, flicker)
    assert a.psnr == pytest.approx(b.psnr, abs=1e-3), "per-frame PSNR cannot tell them apart"
    assert a.temporal_psnr > 60 and b.temporal_psnr < 25
    assert b.temporal_mse == pytest.approx(0.1**2, rel=1e-3)


def read_clip_like_noise() -> torch.Tensor:
    torch.manual_seed(1)
    return torch.rand(12, 3, 16, 16) * 0.8 + 0.1  # inside [0.1, 0.9]: the offsets never clip


def test_temporal_figure_rises_on_a_video_with_injected_flicker(clips, trained, tmp_path):
    source = find_videos(str(clips))[2]
    frames = (read_clip(source, 16).permute(0, 2, 3, 1).numpy() * 255).round()
    clean, flickery = tmp_path / "clean", tmp_path / "flicker"
    clean.mkdir()
    flickery.mkdir()
    write_video(clean / "a.mp4", [f.astype(np.uint8) for f in frames])
    gain = np.array([1.0, 0.7] * 8)[:, None, None, None]  # every other frame 30% darker
    write_video(flickery / "a.mp4", [f.astype(np.uint8) for f in np.clip(frames * gain, 0, 255)])
    weights = resolve_weights(trained)
    steady = score(weights, str(clean)).models[0].overall
    flicker = score(weights, str(flickery)).models[0].overall
    assert flicker.temporal_psnr < steady.temporal_psnr - 3, (steady, flicker)


def test_teacher_scores_taehv_as_a_decoder_of_its_latents(clips, trained, untrained, teacher_dir):
    report = result_dict(
        score(
            resolve_weights(trained), str(clips), compare=resolve_weights(untrained), teacher=str(teacher_dir)
        )
    )
    assert math.isfinite(report["teacher_psnr_vs_input"])
    for model in report["models"]:
        assert math.isfinite(model["teacher"]["psnr_vs_teacher"]) and math.isfinite(
            model["teacher"]["psnr_vs_input"]
        )
    a, b = report["clips"][0]["teacher"]["models"]
    assert a != b, "each model decodes the teacher's latents its own way"
    assert len(report["clips"]) == 3 and all("teacher" in c for c in report["clips"])


def test_streaming_gives_the_figures_of_parallel_on_a_long_clip(tmp_path, trained):
    make_synthetic(tmp_path / "long", clips=1, frames=52, height=SIZE, width=SIZE, seed=5)
    weights = resolve_weights(trained)
    parallel = score(weights, str(tmp_path / "long"), frames=48)
    streaming = score(weights, str(tmp_path / "long"), frames=48, streaming=True)
    assert parallel.models[0].recon[0].shape[0] == 45
    p, s = parallel.models[0].clips[0], streaming.models[0].clips[0]
    for name in ("psnr", "ssim", "temporal_psnr"):
        assert getattr(s, name) == pytest.approx(getattr(p, name), abs=1e-3), name
    assert (streaming.models[0].recon[0] - parallel.models[0].recon[0]).abs().max() < 1e-4


def test_stream_forward_equals_forward_with_memory_in_use():
    # random MemBlock weights (the init zeroes their last conv, which would hide a wrong memory),
    # and the patch-size-2 layout of TAEHV 1.5
    torch.manual_seed(2)
    model = TAEHV(latent_channels=32, patch_size=2).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
        x = torch.rand(2, 13, 3, 16, 16)  # not a multiple of 4: padded alike
        z, y = model(x)
        zs, ys = stream_forward(model, x)
    assert zs.shape == z.shape and ys.shape == y.shape
    assert (zs - z).abs().max() < 1e-4 and (ys - y).abs().max() < 1e-4
    assert y.std() > 0.01


# ---- bad input: each error names the file -------------------------------------------------------


def test_weights_of_another_architecture_name_the_file(tmp_path, clips):
    other = tmp_path / "resnet.safetensors"
    save_file({"conv1.weight": torch.zeros(8, 3, 3, 3), "fc.weight": torch.zeros(10, 8)}, str(other))
    with pytest.raises(WeightsError, match=f"{other}: not TAEHV weights"):
        score(resolve_weights(other), str(clips))


def test_weights_of_another_latent_width_name_the_file(tmp_path, clips, untrained):
    run = write_run(
        tmp_path / "run", {"model": {"latent_channels": 16}, "data": {"height": SIZE, "width": SIZE}}
    )
    (run / "final").mkdir()
    torch.manual_seed(0)
    save_file(TAEHV(latent_channels=8).state_dict(), str(run / "final" / "taehv.safetensors"))
    with pytest.raises(WeightsError, match=f"{run / 'final' / 'taehv.safetensors'}: .* wrong shape"):
        score(resolve_weights(run), str(clips))
    # the file alone (outside a run): its own width is read from it (shapes of no family: `custom`,
    # as a custom run exports them); the 16-channel taehv weights take the same clips, so they
    # compare beside it, each with its own architecture
    alone = tmp_path / "narrow.safetensors"
    alone.write_bytes((run / "final" / "taehv.safetensors").read_bytes())
    narrow = resolve_weights(alone)
    assert narrow.run_dir is None
    report = result_dict(score(narrow, str(clips), compare=resolve_weights(untrained), limit=1))
    assert [m["family"] for m in report["models"]] == ["custom", "taehv"]
    assert "latent_channels=8" in report["models"][0]["config"]
    # named as taehv (its name) but of another width: the error says what its shapes fit
    misnamed = tmp_path / "taehv.safetensors"
    misnamed.write_bytes(alone.read_bytes())
    with pytest.raises(
        WeightsError, match=f"{misnamed}: its name says family taehv, but .*latent_channels=8"
    ):
        score(resolve_weights(misnamed), str(clips))


def test_a_folder_without_a_readable_video_is_named(tmp_path, untrained):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=f"{empty}: no video files"):
        score(resolve_weights(untrained), str(empty))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "a.mp4").write_bytes(b"not a video at all" * 100)
    with pytest.raises(EvalError, match=f"{broken}: no readable video .*{broken / 'a.mp4'}"):
        score(resolve_weights(untrained), str(broken), size=(SIZE, SIZE))


def test_a_missing_teacher_is_named(tmp_path, clips, untrained):
    with pytest.raises(TeacherError, match=f"--teacher = '{tmp_path / 'nope'}'"):
        score(resolve_weights(untrained), str(clips), teacher=str(tmp_path / "nope"))


def test_resolve_weights_reads_runs_checkpoints_and_files(tmp_path):
    run = write_run(tmp_path / "run", {})
    for sub in ("final", "best"):
        (run / sub).mkdir()
        (run / sub / "taehv.safetensors").write_bytes(b"x")
    step = run / "checkpoints" / "step-20"
    step.mkdir(parents=True)
    (step / "weights.safetensors").write_bytes(b"x")
    assert resolve_weights(run) == type(resolve_weights(run))(
        run / "final" / "taehv.safetensors", "final", run
    )
    assert resolve_weights(run / "run.toml", best=True).label == "best"
    assert resolve_weights(step).label == "step-20" and resolve_weights(step).run_dir == run
    assert resolve_weights(run / "best" / "taehv.safetensors").run_dir == run
    (run / "best" / "taehv.safetensors").unlink()
    with pytest.raises(EvalError, match=f"{run / 'best' / 'taehv.safetensors'}: no best weights"):
        resolve_weights(run, best=True)
    with pytest.raises(EvalError, match=f"{tmp_path / 'x.pth'}: no such weights file"):
        resolve_weights(tmp_path / "x.pth")
    with pytest.raises(EvalError, match="--best needs a run directory"):
        resolve_weights(step, best=True)


def test_a_run_that_kept_an_ema_is_scored_by_its_ema_weights_unless_asked_not_to(tmp_path):
    """The GPU presets keep an EMA: its weights chose best/ and are what the samples show, so they
    are what eval scores of a run, a final/ or best/ folder, or a checkpoint, unless --no-ema."""
    run = write_run(tmp_path / "run", {})
    (run / "final").mkdir()
    for name in ("taehv.safetensors", "taehv_ema.safetensors"):
        (run / "final" / name).write_bytes(b"x")
    step = run / "checkpoints" / "step-20"
    step.mkdir(parents=True)
    for name in ("weights.safetensors", "weights_ema.safetensors"):
        (step / name).write_bytes(b"x")
    got = resolve_weights(run)
    assert (got.path, got.label) == (run / "final" / "taehv_ema.safetensors", "final-ema")
    assert resolve_weights(run / "final").path.name == "taehv_ema.safetensors"
    assert (resolve_weights(step).path.name, resolve_weights(step).label) == (
        "weights_ema.safetensors",
        "step-20-ema",
    )
    raw = resolve_weights(run, ema=False)
    assert (raw.path, raw.label) == (run / "final" / "taehv.safetensors", "final")
    assert resolve_weights(step, ema=False).path.name == "weights.safetensors"
    # a file named on its own is scored as named
    assert resolve_weights(run / "final" / "taehv.safetensors").path.name == "taehv.safetensors"


def test_the_authors_pth_layout_loads_and_its_architecture_is_read_from_it(tmp_path):
    # the author's taehv.pth is a plain torch.save'd state dict with these same key names; TAEHV
    # 1.5's is patch size 2 with 32 latent channels
    torch.manual_seed(0)
    reference = TAEHV(latent_channels=32, patch_size=2)
    path = tmp_path / "taehv1_5.pth"
    torch.save(reference.state_dict(), path)
    source = resolve_weights(path)
    model_cfg, run_data, note = architecture(source)
    assert (model_cfg.latent_channels, model_cfg.patch_size, run_data) == (32, 2, None)
    assert "inferred from taehv1_5.pth" in note
    model = load_model(source, model_cfg, torch.device("cpu"))
    for key, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
