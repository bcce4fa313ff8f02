"""`eval` for every TAE family (issue 45): a random file of each family, exported the way the trainer
exports it, scores on tiny real videos at the family's default clip (LTX 16 frames, H3 17) with the
figures of TAEHV.from_file's own reconstruction; base and super decoders of one family compare on the
same clips; weights of two clip rules do not; the teacher's own reconstruction is a baseline beside
the student; and bad input (a file of no named family, a teacher of another family, a clip the
family cannot encode) is a named error, exit 2 through the CLI, never a traceback."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from taehv_console.cli import main
from taehv_console.commands.eval import _print_table
from taehv_console.exit_codes import ExitCode
from trainer.checkpointing import write_exported
from trainer.config import DataSection
from trainer.data import VideoClipDataset, find_videos
from trainer.eval_report import result_dict, write_report
from trainer.evaluate import EvalError, resolve_weights, score
from trainer.families import FAMILIES
from trainer.metrics import psnr_from_mse
from trainer.model import TAEHV, WeightsError
from trainer.teacher import TeacherError, load_teacher, teacher_decoded_frames, teacher_pixels

SIZE = 32  # LTX's 8 x patch 4: the smallest crop every family takes
# (default frames, frames scored): 12 rounded up to the family's quantum; decoded T - 3, LTX T - 7, H3 T - 12
DEFAULTS = {"taeltx_2": (16, 9), "taeltx2_3": (16, 9), "taeh3": (17, 5)}


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("family-clips")
    from trainer.synthetic import make_synthetic

    make_synthetic(d, clips=1, frames=17, height=SIZE, width=SIZE, seed=11)
    return d


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """family -> a randomly initialised file of it, written as the trainer's export writes final/
    (<family>.safetensors with the family in its header, <family>.pth beside it)."""
    root = tmp_path_factory.mktemp("family-weights")
    made: dict[str, Path] = {}

    def make(family: str, seed: int = 0) -> Path:
        if family not in made:
            torch.manual_seed(seed)
            model = TAEHV.for_family(family)
            with torch.no_grad():  # MemBlocks start as the identity: stir them so the decoders differ
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.01)
            (root / family).mkdir()
            path = root / family / f"{family}.safetensors"
            write_exported(model.state_dict(), path, {"family": family, "run": "test", "preset": "none"})
            made[family] = path
        return made[family]

    return make


def clip_of(path: Path, frames: int) -> torch.Tensor:
    cfg = DataSection(frames=frames, height=SIZE, width=SIZE)
    return VideoClipDataset([path], cfg, train=False)[0]["video"].float()[None] / 255


def mse_psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    return psnr_from_mse(torch.mean((a.float() - b.float()) ** 2).item())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_scores_at_its_own_clip_and_says_its_family(family, clips, weights, tmp_path):
    path = weights(family)
    report = write_report(score(resolve_weights(path), str(clips), device="cpu"), tmp_path)
    frames, scored = DEFAULTS.get(family, (12, 9))
    assert (report["family"], report["models"][0]["family"]) == (family, family)
    assert f"family {family}" in report["models"][0]["config"]
    assert (report["frames"], report["scored_frames"], report["height"]) == (frames, scored, SIZE)
    assert json.loads(Path(report["json"]).read_text())["family"] == family

    # the figure is the family's own reconstruction, as its author's conventions give it
    model = TAEHV.from_file(path.with_suffix(".pth")).eval()  # loads by name, strictly
    x = clip_of(find_videos(str(clips))[0], frames)
    with torch.no_grad():
        y = model(x)[1]
    assert y.shape[1] == scored
    assert report["models"][0]["overall"]["psnr"] == pytest.approx(mse_psnr(y, x[:, :scored]), abs=1e-3)


@pytest.mark.parametrize(
    ("family", "frames", "size", "says"),
    [
        ("taeltx_2", 12, SIZE, "multiple of 8 .*nearest lengths that work: 8 or 16"),
        ("taeltx_2", 16, 16, "multiple of 32 .*taeltx_2"),
        ("taeh3", 16, SIZE, "multiple of 17 .*17-frame chunks"),
        ("taew2_2", 12, 24, "multiple of 16 .*8 x patch 2"),
    ],
)
def test_a_clip_the_family_cannot_encode_is_refused_with_what_works(
    family, frames, size, says, clips, weights
):
    with pytest.raises(EvalError, match=f"(?s)family {family}.*{says}"):
        score(resolve_weights(weights(family)), str(clips), frames=frames, size=(size, size))


@pytest.mark.parametrize("base", ["taew2_2", "taehv1_5"])
def test_base_and_super_decoders_of_one_family_compare_on_the_same_clips(
    base, clips, weights, tmp_path, capsys, monkeypatch
):
    a, b = resolve_weights(weights(base)), resolve_weights(weights(f"{base}_super"))
    both = write_report(score(a, str(clips), compare=b, device="cpu"), tmp_path)
    assert [m["family"] for m in both["models"]] == [base, f"{base}_super"]
    # the super weights are read with their own decoder, as they score alone
    alone = result_dict(score(b, str(clips), device="cpu"))["models"][0]["overall"]
    assert both["models"][1]["overall"]["psnr"] == pytest.approx(alone["psnr"], abs=1e-4)
    assert both["models"][0]["overall"]["psnr"] != both["models"][1]["overall"]["psnr"]
    assert Path(both["contact_sheet"]).name == f"eval-{base}-vs-{base}_super.png"
    monkeypatch.setenv("COLUMNS", "250")
    _print_table(both)
    out = " ".join(capsys.readouterr().out.split())
    assert (
        f"families {base} vs {base}_super: 1 clip(s)" in out and f"{base}_super (family {base}_super)" in out
    )


def test_weights_of_two_clip_rules_do_not_compare(clips, weights):
    taehv, ltx = resolve_weights(weights("taehv")), resolve_weights(weights("taeltx_2"))
    with pytest.raises(
        EvalError, match="--compare .*taeltx_2.safetensors: family taeltx_2 takes clips of a multiple of 8"
    ):
        score(taehv, str(clips), compare=ltx)
    # one clip rule, but CogVideoX keeps all 8 frames of 2 latents where taehv keeps 5: named, with
    # the lengths where they agree
    with pytest.raises(EvalError, match="decodes 8 frames and taehv .* 5.*agree at --frames 4 or 12"):
        score(taehv, str(clips), compare=resolve_weights(weights("taecvx")), frames=8)


def test_the_teachers_own_reconstruction_is_a_baseline_beside_the_student(
    clips, weights, wan_dir, tmp_path, capsys, monkeypatch
):
    argv = ["eval", str(weights("taew2_1")), "--data", str(clips), "--teacher", str(wan_dir)]
    assert main([*argv, "--out", str(tmp_path), "--json"]) == ExitCode.DONE
    report = json.loads(capsys.readouterr().out)
    assert report["teacher"]["class"] == "AutoencoderKLWan" and report["teacher"]["path"] == str(wan_dir)

    # by hand: the Wan VAE encodes frames [0, T - 3) and decodes them; scored on the student's frames
    teacher = load_teacher(wan_dir, latent_channels=16, family="taew2_1")
    x = clip_of(find_videos(str(clips))[0], 12)
    with torch.no_grad():
        lat = teacher.encode(teacher_pixels(teacher, x[:, :9])).latent_dist.mode()
        own = teacher_decoded_frames(teacher, teacher.decode(lat).sample)
    assert own.shape[1] == report["scored_frames"] == 9
    want = mse_psnr(own, x[:, :9])
    assert report["teacher"]["overall"]["psnr"] == pytest.approx(want, abs=1e-3)
    assert report["teacher_psnr_vs_input"] == pytest.approx(want, abs=1e-3)
    assert report["clips"][0]["teacher"]["own"]["psnr"] == pytest.approx(want, abs=1e-3)
    assert 0 < report["teacher"]["overall"]["ssim"] < 1
    assert math.isfinite(report["teacher"]["overall"]["temporal_psnr"])
    student = report["models"][0]["teacher"]
    assert math.isfinite(student["psnr_vs_teacher"]) and math.isfinite(student["psnr_vs_input"])

    # the table names the family and the teacher, its row beside the student's
    monkeypatch.setenv("COLUMNS", "250")
    _print_table(report)
    out = " ".join(capsys.readouterr().out.split())
    assert "taew2_1 (family taew2_1)" in out and "family taew2_1:" in out
    assert "teacher AutoencoderKLWan" in out
    row = f"the teacher's own encode + decode (AutoencoderKLWan) │ {report['teacher']['overall']['psnr']:.2f}"
    assert row in out, out


def test_a_teacher_of_another_family_is_named(clips, weights, wan_dir):
    with pytest.raises(
        TeacherError,
        match="--teacher = .*AutoencoderKLWan.*model.family = taehv1_5.*it fits model.family = taew2_1",
    ):
        score(resolve_weights(weights("taehv1_5")), str(clips), teacher=str(wan_dir))
    # a --compare of another latent width cannot decode the teacher's latents either
    with pytest.raises(TeacherError, match="for --compare .*custom.*latent"):
        narrow = weights("taew2_1").parent.parent / "narrow.safetensors"
        if not narrow.exists():
            torch.manual_seed(0)
            write_exported(TAEHV(latent_channels=8).state_dict(), narrow, {"family": "custom"})
        score(
            resolve_weights(weights("taew2_1")),
            str(clips),
            compare=resolve_weights(narrow),
            teacher=str(wan_dir),
        )


def test_a_teacher_that_cannot_code_the_clip_is_named_with_what_to_change(clips, weights, tiny_teachers):
    # LTX-2's VAE at a 32-px crop: one latent cell, which its decoder's padding cannot take
    ltx = tiny_teachers("taeltx_2")
    with pytest.raises(
        TeacherError,
        match=f"--teacher = '{ltx}': AutoencoderKLLTX2Video cannot encode and decode a 16-frame 32x32 clip "
        r"\(.*\); try more --frames or a larger --size",
    ):
        score(resolve_weights(weights("taeltx_2")), str(clips), teacher=str(ltx))


def test_streaming_scores_h3_chunks_as_the_parallel_path_does(clips, weights):
    h3 = resolve_weights(weights("taeh3"))
    parallel, streaming = (score(h3, str(clips), streaming=s).models[0] for s in (False, True))
    assert streaming.recon[0].shape == parallel.recon[0].shape == (5, 3, SIZE, SIZE)
    assert (streaming.recon[0] - parallel.recon[0]).abs().max() < 1e-4
    assert streaming.overall.psnr == pytest.approx(parallel.overall.psnr, abs=1e-3)


def test_a_file_of_no_named_family_lists_the_candidates(clips, weights, tmp_path):
    bare = tmp_path / "weights.pth"  # taehv's shapes, no metadata, a name that says no family
    bare.write_bytes(weights("taehv").with_suffix(".pth").read_bytes())
    with pytest.raises(
        WeightsError,
        match=f"{bare}: cannot tell the family: .*fit several: taehv, taew2_1, taecvx; pass --family",
    ):
        score(resolve_weights(bare), str(clips))
    assert result_dict(score(resolve_weights(bare), str(clips), family="taew2_1"))["family"] == "taew2_1"
    with pytest.raises(
        WeightsError,
        match=f"{bare}: --family says family taew2_2, but its tensors .* fit taehv, taew2_1, taecvx",
    ):
        score(resolve_weights(bare), str(clips), family="taew2_2")
    # as --compare, a file naming no family is read as the first weights' family where its shapes fit
    beside = result_dict(
        score(resolve_weights(weights("taew2_1")), str(clips), compare=resolve_weights(bare))
    )
    assert [m["family"] for m in beside["models"]] == ["taew2_1", "taew2_1"]
    misnamed = tmp_path / "taeltx_2.pth"
    misnamed.write_bytes(bare.read_bytes())
    with pytest.raises(WeightsError, match=f"{misnamed}: its name says family taeltx_2, but"):
        score(resolve_weights(misnamed), str(clips))


# ---- through the CLI: exit 2 naming what and where, no traceback ---------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["{bare}"], "{bare}: cannot tell the family"),
        (["{bare}", "--family", "taew9"], "--family 'taew9': unknown family; known: taehv, taew2_1"),
        (["{taehv1_5}", "--teacher", "{wan}"], "it fits model.family = taew2_1"),
        (["{taehv}", "--compare", "{ltx}"], "family taeltx_2 takes clips of a multiple of 8 frames"),
        (["{ltx}", "--frames", "12"], "nearest lengths that work: 8 or 16"),
    ],
)
def test_bad_input_through_the_cli_exits_2_naming_it(args, says, clips, weights, wan_dir, tmp_path, capsys):
    bare = tmp_path / "weights.pth"
    bare.write_bytes(weights("taehv").with_suffix(".pth").read_bytes())
    names = {
        "bare": bare,
        "wan": wan_dir,
        "taehv": weights("taehv"),
        "taehv1_5": weights("taehv1_5"),
        "ltx": weights("taeltx_2"),
    }
    argv = ["eval", *(a.format(**names) for a in args), "--data", str(clips), "--out", str(tmp_path)]
    assert main(argv) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("taehv-console eval: ") and "Traceback" not in err, err
    assert says.format(**names) in " ".join(err.split()), err
