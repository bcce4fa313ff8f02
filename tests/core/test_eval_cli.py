"""`taehv-console eval` as a user types it: a run id under --runs, --json with every figure, the
contact sheet in RUN/eval/, a readable table, exit 2 naming the file for bad input, and a
`--help` that imports no torch."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from taehv_console.cli import main
from taehv_console.exit_codes import ExitCode
from tests.core.test_cli_startup import loaded_after
from tests.trainer.runs import write_run
from trainer.model import TAEHV
from trainer.synthetic import make_synthetic


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-cli")
    make_synthetic(root / "clips", clips=2, frames=12, height=32, width=32, seed=4)
    runs = root / "runs"
    run = write_run(runs / "20260101-000000-cpu-smoke", {"data": {"frames": 8, "height": 32, "width": 32}})
    (run / "final").mkdir()
    torch.manual_seed(0)
    save_file(TAEHV().state_dict(), str(run / "final" / "taehv.safetensors"))
    save_file(TAEHV(latent_channels=8).state_dict(), str(root / "narrow.safetensors"))
    # LTX-2's shapes: 8x time, 32-px crops, a clip rule no taehv-shaped weights share
    save_file(TAEHV.for_family("taeltx_2").state_dict(), str(root / "ltx.safetensors"))
    return root, runs, run


def test_a_run_id_scores_final_and_prints_every_figure_as_json(setup, capsys):
    root, runs, run = setup
    code = main(["eval", "20260101", "--runs", str(runs), "--data", str(root / "clips"), "--json"])
    out = capsys.readouterr().out
    assert code == ExitCode.DONE
    report = json.loads(out)
    assert report["models"][0]["weights"] == str(run / "final" / "taehv.safetensors")
    assert report["frames"] == 8 and report["scored_frames"] == 5, "clip length from the run's run.toml"
    assert report["contact_sheet"] == str(run / "eval" / "eval-final.png")
    assert (run / "eval" / "eval-final.png").is_file() and (run / "eval" / "eval-final.json").is_file()
    assert len(report["clips"]) == 2
    for key in ("psnr", "ssim", "temporal_psnr", "temporal_mse"):
        assert isinstance(report["models"][0]["overall"][key], float)
        assert isinstance(report["baselines"]["mean_colour"][key], float)


def test_the_table_names_the_figures_and_the_files(setup, capsys, tmp_path):
    root, _runs, run = setup
    code = main(["eval", str(run), "--data", str(root / "clips"), "--frames", "12", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == ExitCode.DONE
    for words in ("PSNR dB", "SSIM", "temporal PSNR dB", "mid-grey output", "mean colour", "final"):
        assert words in out
    assert str(tmp_path / "eval-final.png") in out.replace("\n", "")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["{root}/narrow.safetensors", "--compare", "{root}/ltx.safetensors"], "{root}/ltx.safetensors"),
        (["{root}/missing.pth"], "{root}/missing.pth"),
        (["{run}", "--best"], "{run}/best/taehv.safetensors"),
        (["{run}", "--data", "{root}/nothing-here"], "{root}/nothing-here"),
        (["{run}", "--frames", "10"], "frames"),
    ],
)
def test_bad_input_exits_2_naming_the_file(setup, capsys, args, named):
    root, _runs, run = setup
    argv = ["eval", *(a.format(root=root, run=run) for a in args)]
    if "--data" not in argv:
        argv += ["--data", str(root / "clips")]
    assert main(argv) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("taehv-console eval: ") and named.format(root=root, run=run) in err, err


def test_eval_help_imports_no_torch():
    assert loaded_after("eval", "--help") == []
