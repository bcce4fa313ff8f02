"""core/watch/samples.py on sample directories written as validation writes them (real PNGs and
videos): complete steps only, newest first; one step's index; errors that name the file."""

from __future__ import annotations

import json

import av
import pytest
from PIL import Image

from taehv_console.core.watch.samples import (
    SamplesError,
    list_sample_steps,
    load_sample_step,
    newest_samples,
    validation_every,
)
from tests.sample_steps import write_sample_step


def test_a_run_without_samples_lists_none(tmp_path):
    assert list_sample_steps(tmp_path) == ()
    assert newest_samples(tmp_path) is None
    (tmp_path / "samples").mkdir()
    assert list_sample_steps(tmp_path) == ()


def test_complete_steps_newest_first_and_a_step_being_written_is_not_one(tmp_path):
    for step in (10, 30, 20):
        write_sample_step(tmp_path, step, clips=2, videos=False)
    write_sample_step(tmp_path, 40, clips=2, videos=False, complete=False)  # index.json not yet there
    (tmp_path / "samples" / "notes.txt").write_text("not a step")
    (tmp_path / "samples" / "step-x").mkdir()
    assert list_sample_steps(tmp_path) == (30, 20, 10)
    newest = newest_samples(tmp_path)
    assert newest is not None and newest.step == 30


def test_a_step_loads_with_its_files_psnr_and_paths(tmp_path):
    step_dir = write_sample_step(tmp_path, 20, clips=4, frames=4, height=24, width=32)
    s = load_sample_step(tmp_path, 20)
    assert s.step == 20 and s.path == step_dir and s.amplify == 4
    assert [c.index for c in s.clips] == [0, 1, 2, 3]
    c = s.clip(1)
    assert c is not None and c.png == step_dir / "clip-1.png" and c.video == step_dir / "clip-1.mp4"
    assert c.psnr == pytest.approx(19.5) and (c.frames, c.height, c.width) == (4, 24, 32)
    with Image.open(c.png) as im:  # the strip: 3 rows of H, T frames of W side by side
        assert im.size == (4 * 32, 3 * 24)
    with av.open(str(c.video)) as v:
        assert v.streams.video[0].width == 2 * 32
    assert s.paths()[:2] == (step_dir / "clip-0.png", step_dir / "clip-0.mp4")
    assert s.to_dict()["clips"][3]["png"] == str(step_dir / "clip-3.png")


def _index(tmp_path, body) -> None:
    d = tmp_path / "samples" / "step-5"
    d.mkdir(parents=True, exist_ok=True)
    (d / "index.json").write_text(body if isinstance(body, str) else json.dumps(body))


@pytest.mark.parametrize(
    "body, says",
    [
        ("{not json", "cannot read it"),
        ({"step": 5}, "'clips' list"),
        (
            {"step": 5, "clips": [{"png": "clip-0.png"}]},
            "clips[0]: expected an object with an integer 'index'",
        ),
        (
            {"step": 5, "clips": [{"index": 0, "png": "../../etc/passwd"}]},
            "clips[0].png: expected a file name",
        ),
        ({"step": 6, "clips": []}, "says step 6, but sits in step-5/"),
    ],
)
def test_a_bad_index_is_an_error_naming_the_file(tmp_path, body, says):
    _index(tmp_path, body)
    with pytest.raises(SamplesError) as err:
        load_sample_step(tmp_path, 5)
    assert str(tmp_path / "samples" / "step-5" / "index.json") in str(err.value) and says in str(err.value)


def test_newest_samples_passes_over_a_broken_newer_step(tmp_path):
    write_sample_step(tmp_path, 3, clips=1, videos=False)
    _index(tmp_path, "{broken")
    assert list_sample_steps(tmp_path) == (5, 3)
    newest = newest_samples(tmp_path)
    assert newest is not None and newest.step == 3


def test_a_non_finite_psnr_reads_as_none(tmp_path):
    _index(tmp_path, {"step": 5, "clips": [{"index": 0, "psnr": None, "png": "clip-0.png"}]})
    assert load_sample_step(tmp_path, 5).clips[0].psnr is None


def test_validation_every_comes_from_run_toml(tmp_path):
    assert validation_every(tmp_path) is None
    (tmp_path / "run.toml").write_text("[schedule]\nval_every = 10\n")
    assert validation_every(tmp_path) == 10
    (tmp_path / "run.toml").write_text("[schedule]\nval_every = 0\n")
    assert validation_every(tmp_path) is None


def test_reads_what_the_trainer_writes(tmp_path):
    """The trainer's own writer (trainer/samples.py), on small tensors: the console finds the step,
    each clip's strip (3 rows of H, T frames of W), video and PSNR."""
    import torch

    from trainer.samples import SampleClip as TrainerClip
    from trainer.samples import write_step_samples

    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, 3, 16, 24, generator=g)
    clips = [TrainerClip(k, f"/data/v{k}.mp4", x, (x * 0.9).clamp(0, 1), 20.0 + k) for k in range(2)]
    write_step_samples(tmp_path, 30, clips)
    assert list_sample_steps(tmp_path) == (30,)
    s = load_sample_step(tmp_path, 30)
    assert [c.index for c in s.clips] == [0, 1] and s.amplify == 4
    c = s.clips[1]
    assert c.psnr == pytest.approx(21.0) and c.source == "/data/v1.mp4" and c.video is not None
    with Image.open(c.png) as im:
        assert im.size == (4 * 24, 3 * 16)
    assert c.video.is_file()
