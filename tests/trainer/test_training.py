"""Real training runs: accelerate + DeepSpeed on CPU (gloo), 1 and 2 processes, ZeRO-2 and ZeRO-3.

Each module-scoped run is shared by the tests that read it, so CI pays for each run once.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from tests.trainer.runs import BF16_CROP, Launch, base_config, events, run_to_end, wait_for, write_run
from trainer import checkpoint as ckpt
from trainer.config import load_config
from trainer.data import VideoClipDataset, find_videos, split_train_val, validation_items
from trainer.ds_config import build_deepspeed_config
from trainer.metrics import psnr_from_mse
from trainer.synthetic import make_synthetic
from trainer.train import lr_at

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def data_with_bad_clips(clip_dir, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("mixed")
    for p in clip_dir.iterdir():
        shutil.copy(p, d / p.name)
    (d / "corrupt-a.mp4").write_bytes(os.urandom(5000))
    (d / "corrupt-b.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + os.urandom(3000))
    short = make_synthetic(d / "short", clips=1, frames=3, height=64, width=80, seed=99)
    assert short
    return d


@pytest.fixture(scope="module")
def zero2_run(tmp_path_factory, data_with_bad_clips) -> Path:
    run = write_run(
        tmp_path_factory.mktemp("z2") / "run",
        base_config(data_with_bad_clips, optim={"ema_decay": 0.9}),
    )
    # the FIFOs ProcessGroupNCCL would make for the Flight Recorder (gloo makes none): each rank
    # removes its own at exit
    pipe_stem = str(run.parent / "fr-rank_")
    for r in (0, 1, 2):
        os.mkfifo(f"{pipe_stem}{r}.pipe")
    run_to_end(run, 2, env={"TORCH_NCCL_DEBUG_INFO_PIPE_FILE": pipe_stem})
    return run


@pytest.fixture(scope="module")
def zero3_run(tmp_path_factory, clip_dir) -> Path:
    run = write_run(
        tmp_path_factory.mktemp("z3") / "run",
        base_config(
            clip_dir,
            deepspeed={
                "zero_stage": 3,
                "stage3_prefetch_bucket_size": 123_456,
                "stage3_max_live_parameters": 7_654_321,
                "stage3_param_persistence_threshold": 4_321,
                "stage3_max_reuse_distance": 9_999_999,
                "reduce_bucket_size": 2_345_678,
            },
            optim={"ema_decay": 0.9},
        ),
    )
    # rank 1's loss is NaN at step 2: every rank must skip that micro-batch together (no hang)
    run_to_end(run, 2, env={"TAEHV_FAULTS": "nan:1:2"})
    return run


def _losses(run: Path) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in events(run, 0, "step")}


# ---------------------------------------------------------------- ZeRO-2


def test_zero2_run_learns_and_writes_every_artifact(zero2_run):
    assert sorted(p.name for p in zero2_run.parent.glob("fr-rank_*")) == ["fr-rank_2.pipe"]  # not a rank here
    steps = events(zero2_run, 0, "step")
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5, 6]
    first, last = steps[0]["loss"], min(e["loss"] for e in steps[-2:])
    assert last < first, f"loss did not fall: {[round(e['loss'], 5) for e in steps]}"
    for e in steps:
        for field in ("loss", "recon_loss", "psnr", "lr", "grad_norm", "samples_per_s", "step_time_s"):
            assert field in e and e[field] is not None, field
        assert math.isclose(e["psnr"], psnr_from_mse(e["recon_loss"]), rel_tol=1e-9)
        # time blocked on the loader (in-process here: num_workers 0), and its share of the step
        assert 0 < e["data_wait_s"] < e["step_time_s"]
        assert math.isclose(e["data_wait_share"], e["data_wait_s"] / e["step_time_s"], rel_tol=1e-6)
    start = events(zero2_run, 1, "start")[0]
    assert start["world_size"] == 2 and start["zero_stage"] == 2 and start["precision"] == "no"
    assert start["nonfinite_guard"] == "micro-batch"  # fp32: DeepSpeed checks no gradients, the trainer does
    assert events(zero2_run, 0, "stop")[-1]["reason"] == "done"
    for r in (0, 1):
        beat = json.loads((zero2_run / "heartbeat" / f"rank-{r}.json").read_text())
        assert beat["step"] == 6 and beat["pid"] > 0
    assert list((zero2_run / "tensorboard").glob("events.out.tfevents.*"))
    vals = events(zero2_run, 0, "val")
    assert [v["step"] for v in vals] == [3, 6] and all(0 < v["ssim"] <= 1 for v in vals)
    # checkpoints: complete by the protocol, `latest` names the newest, >= 2 kept
    scan = ckpt.scan(zero2_run / "checkpoints")
    assert [s.step for s in scan.complete] == [6, 3] and not scan.skipped
    assert (zero2_run / "checkpoints" / "latest").read_text().strip() == "step-6"
    assert events(zero2_run, 0, "checkpoint")[-1]["status"] == "complete"
    assert (zero2_run / "final" / "taehv.safetensors").is_file()
    assert (zero2_run / "best" / "taehv.safetensors").is_file()
    # EMA is on in this run: the EMA weights' validation chooses best/
    best = json.loads((zero2_run / "best" / "info.json").read_text())
    assert best["chosen_by"] == "ema_psnr" and best["ema_psnr"] == max(v["ema_psnr"] for v in vals)
    assert all(0 < v["ema_ssim"] <= 1 for v in vals)


def test_each_validation_writes_samples_that_a_decode_of_the_exported_weights_reproduces(zero2_run):
    """Rank 0 writes RUN/samples/step-<N>/ at every validation from validation's own outputs: a PNG
    strip per clip (input, reconstruction, error ×4), a side-by-side video, and index.json last."""
    import av
    import numpy as np
    from PIL import Image
    from safetensors.torch import load_file
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from trainer.model import TAEHV, reconstruction_target
    from trainer.samples import AMPLIFY

    vals = events(zero2_run, 0, "val")
    assert [v["step"] for v in vals] == [3, 6]
    assert [v["samples"] for v in vals] == [str(zero2_run / "samples" / f"step-{s}") for s in (3, 6)]
    indexes = [json.loads((zero2_run / "samples" / f"step-{s}" / "index.json").read_text()) for s in (3, 6)]
    # the same clips at every validation: rank 0's share of the validation split (2 of 4 clips here)
    assert [c["source"] for c in indexes[0]["clips"]] == [c["source"] for c in indexes[1]["clips"]]
    assert [c["index"] for c in indexes[1]["clips"]] == [0, 1]
    cfg = load_config(zero2_run / "run.toml")
    _train, val_paths = split_train_val(
        find_videos(cfg.data.source), cfg.data.val_fraction, cfg.data.val_max_clips
    )
    ds = VideoClipDataset(val_paths, cfg.data, train=False)
    model = TAEHV()
    model.load_state_dict(
        load_file(str(zero2_run / "final" / "taehv_ema.safetensors"))
    )  # EMA on: it is shown
    model.eval()
    step_dir = zero2_run / "samples" / "step-6"
    for clip in indexes[1]["clips"]:
        x = ds[(val_paths.index(Path(clip["source"])), 0)]["video"][None].float() / 255
        with torch.no_grad():
            _z, y = model(x)
        x = reconstruction_target(x, y.shape[1])
        t, h, w = clip["frames"], clip["height"], clip["width"]
        assert (t, h, w) == (y.shape[1], y.shape[3], y.shape[4])
        png = np.asarray(Image.open(step_dir / clip["png"]).convert("RGB")).astype(np.int16)
        assert png.shape == (3 * h, t * w, 3)
        assert np.abs(png[:h] - _frames_left_to_right(x)).max() <= 1
        assert (
            np.abs(png[h : 2 * h] - _frames_left_to_right(y)).max() <= 2
        )  # the exported EMA weights' decode
        error = _frames_left_to_right(((y - x).abs() * AMPLIFY).clamp(0, 1))
        assert np.abs(png[2 * h :] - error).max() <= 2 * AMPLIFY and error.max() > 0
        with av.open(str(step_dir / clip["video"])) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) == t and frames[0].shape[:2] == (h + h % 2, 2 * w + (2 * w) % 2)
    tb = EventAccumulator(str(zero2_run / "tensorboard"), size_guidance={"images": 0})
    tb.Reload()
    assert {"val/samples/clip-0", "val/samples/clip-1"} <= set(tb.Tags()["images"])
    assert [e.step for e in tb.Images("val/samples/clip-0")] == [3, 6]


def _frames_left_to_right(video: torch.Tensor):
    """1×T×3×H×W in [0, 1] -> H×(T·W)×3 as int16, the frames side by side, rounded as a PNG holds them."""
    import numpy as np

    _n, t, _c, h, w = video.shape
    u8 = (video[0].clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return u8.transpose(1, 0, 2, 3).reshape(h, t * w, 3).astype(np.int16)


def test_corrupt_and_short_videos_are_skipped_and_reported(zero2_run, data_with_bad_clips):
    train, _val = split_train_val(find_videos(str(data_with_bad_clips)), 0.25, 64)
    bad_in_train = {str(p) for p in train if "corrupt" in p.name or "short" in str(p)}
    assert bad_in_train, "the split put no bad clip in the training set; the test would prove nothing"
    reported = [e for r in (0, 1) for e in events(zero2_run, r, "data")]
    assert {e["path"] for e in reported} <= {str(p) for p in find_videos(str(data_with_bad_clips))}
    assert bad_in_train <= {e["path"] for e in reported}
    assert all(e["reason"] for e in reported)
    # each bad video is decoded at most once per rank: never endless retry
    for r in (0, 1):
        paths = [e["path"] for e in events(zero2_run, r, "data")]
        assert len(paths) == len(set(paths))


def test_every_deepspeed_setting_reaches_the_engine(zero2_run, zero3_run):
    for run in (zero2_run, zero3_run):
        asked = build_deepspeed_config(load_config(run / "run.toml"), "cpu")
        got = json.loads((run / "deepspeed.effective.json").read_text())
        for key in (
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
            "train_batch_size",
            "gradient_clipping",
            "bf16",
        ):
            assert got[key] == asked[key], key
        assert got["zero_optimization"] == asked["zero_optimization"]
    z3 = json.loads((zero3_run / "deepspeed.effective.json").read_text())["zero_optimization"]
    assert z3["stage3_prefetch_bucket_size"] == 123_456 and z3["reduce_bucket_size"] == 2_345_678


def test_lr_per_optimizer_step_is_the_same_for_one_and_two_processes(zero2_run, tmp_path, clip_dir):
    one = write_run(tmp_path / "one", base_config(clip_dir, topology={"gpus_per_node": 1}))
    run_to_end(one, 1)
    lr1 = [e["lr"] for e in events(one, 0, "step")]
    lr2 = [e["lr"] for e in events(zero2_run, 0, "step")]
    cfg = load_config(one / "run.toml")
    assert lr1 == lr2 == [lr_at(s, cfg) for s in range(6)]
    assert lr1[1] == cfg.optim.lr and lr1[-1] < lr1[2]  # warmup peak, then cosine decay


def test_resume_continues_where_the_uninterrupted_run_would_be(zero2_run, tmp_path):
    # a run stopped after step 3: the uninterrupted run's own step-3 checkpoint
    resumed = tmp_path / "resumed"
    write_run(resumed, load_config(zero2_run / "run.toml").model_dump(mode="json"))
    shutil.copytree(zero2_run / "checkpoints" / "step-3", resumed / "checkpoints" / "step-3")
    run_to_end(resumed, 2, args=("--resume", "latest"))
    start = events(resumed, 0, "start")[0]
    assert start["resumed_from"].endswith("step-3") and start["step"] == 3
    a = {e["step"]: e for e in events(zero2_run, 0, "step")}
    b = {e["step"]: e for e in events(resumed, 0, "step")}
    assert sorted(b) == [4, 5, 6]
    for s in (4, 5, 6):
        assert b[s]["lr"] == a[s]["lr"]
        assert math.isclose(b[s]["loss"], a[s]["loss"], rel_tol=1e-3, abs_tol=1e-6), (
            s,
            a[s]["loss"],
            b[s]["loss"],
        )


# ---------------------------------------------------------------- ZeRO-3


def test_zero3_nonfinite_loss_is_skipped_by_all_ranks_together(zero3_run):
    assert [e["step"] for e in events(zero3_run, 0, "step")] == [1, 2, 3, 4, 5, 6]
    last = events(zero3_run, 0, "step")[-1]
    assert last["nonfinite_skipped"] == 1
    assert all(math.isfinite(e["loss"]) for e in events(zero3_run, 0, "step"))
    assert events(zero3_run, 1, "stop")[-1]["reason"] == "done"


def _psnr_of_weights(run: Path, weights: dict) -> float:
    from trainer.model import TAEHV, reconstruction_target

    cfg = load_config(run / "run.toml")
    model = TAEHV()
    model.load_state_dict(weights)
    model.eval()
    _train, val = split_train_val(find_videos(cfg.data.source), cfg.data.val_fraction, cfg.data.val_max_clips)
    ds = VideoClipDataset(val, cfg.data, train=False)
    psnrs = []
    with torch.no_grad():
        for index, seed, counts in validation_items(len(ds), 0, 1):
            x = ds[(index, seed)]["video"][None].float() / 255
            _z, y = model(x)
            psnrs.append(psnr_from_mse(torch.mean((y - reconstruction_target(x, y.shape[1])) ** 2).item()))
    return sum(psnrs) / len(psnrs)


def test_zero3_final_weights_are_full_and_reproduce_the_last_validation(zero3_run):
    from safetensors.torch import load_file

    from trainer.model import TAEHV

    weights = load_file(str(zero3_run / "final" / "taehv.safetensors"))
    ref = TAEHV().state_dict()
    assert {k: tuple(v.shape) for k, v in weights.items()} == {k: tuple(v.shape) for k, v in ref.items()}
    assert all(v.numel() > 0 and torch.isfinite(v).all() for v in weights.values())
    last_val = events(zero3_run, 0, "val")[-1]
    assert last_val["step"] == 6
    assert abs(_psnr_of_weights(zero3_run, weights) - last_val["psnr"]) < 0.1
    ema = load_file(str(zero3_run / "final" / "taehv_ema.safetensors"))
    assert ema.keys() == weights.keys()
    assert any(not torch.equal(ema[k], weights[k]) for k in weights)  # EMA is its own set of weights


def test_zero3_validates_a_split_that_does_not_divide_by_the_ranks(tmp_path, clip_dir):
    """3 validation clips on 2 ranks: rank 1 runs a filler forward (which counts for nothing) so
    that both run the same number of ZeRO-3 gathers; a rank that skipped it would hang the other."""
    cfg = base_config(
        clip_dir,
        data={"val_fraction": 0.4, "val_max_clips": 3},
        optim={"max_steps": 2},
        # every parameter partitioned and released after use, so every forward gathers
        deepspeed={
            "zero_stage": 3,
            "stage3_param_persistence_threshold": 0,
            "stage3_max_live_parameters": 1,
            "stage3_max_reuse_distance": 0,
        },
        schedule={"val_every": 1, "checkpoint_every": 1000},
        distributed={"collective_timeout_s": 60},
    )
    run = write_run(tmp_path / "run", cfg)
    run_to_end(run, 2)
    vals = events(run, 0, "val")
    assert [v["step"] for v in vals] == [1, 2] and all(v["n_clips"] == 3 for v in vals)


# ---------------------------------------------------------------- signals and failures


def test_sigterm_mid_run_checkpoints_the_current_step_on_every_rank(tmp_path, clip_dir):
    # loader workers (every GPU preset has them) share the rank's process group and get the SIGTERM too
    run = write_run(
        tmp_path / "run",
        base_config(
            clip_dir,
            optim={"max_steps": 500},
            data={"num_workers": 1},
            schedule={"checkpoint_every": 1000, "val_every": 1000},
        ),
    )
    launch = Launch(run, 2)
    wait_for(lambda: len(events(run, 0, "step")) >= 2, 180, "two steps", launch)
    os.killpg(launch.proc.pid, signal.SIGTERM)  # what `taehv-console stop` sends: the launcher's group
    # torchrun itself reports the signal with a non-zero status; the ranks' own outcome is in their events
    launch.wait(120)
    stops = [events(run, r, "stop")[-1] for r in (0, 1)]
    assert all(s["reason"] == "signal" and s["signal"] == "SIGTERM" and s["exit_status"] == 0 for s in stops)
    assert stops[0]["step"] == stops[1]["step"] >= 2  # both ranks agreed on the step to stop at
    newest = ckpt.scan(run / "checkpoints").newest
    assert newest is not None and newest.step == stops[0]["step"]


def test_sigterm_makes_the_trainer_process_exit_0(tmp_path, clip_dir):
    import subprocess
    import sys

    run = write_run(
        tmp_path / "run",
        base_config(
            clip_dir,
            topology={"gpus_per_node": 1},
            optim={"max_steps": 500},
            schedule={"checkpoint_every": 1000, "val_every": 1000},
        ),
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.cli", "--run", str(run)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "DS_ACCELERATOR": "cpu"},
    )
    try:
        wait_for(lambda: len(events(run, 0, "step")) >= 1, 180, "a step", run_dir=run)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0
    finally:
        proc.kill()
    stop = events(run, 0, "stop")[-1]
    assert stop["reason"] == "signal"
    assert ckpt.scan(run / "checkpoints").newest.step == stop["step"]


def test_kill_9_during_checkpoint_never_takes_the_tmp_dir(tmp_path, clip_dir):
    cfg = base_config(clip_dir, schedule={"checkpoint_every": 2, "val_every": 1000})
    run = write_run(tmp_path / "run", cfg)
    # rank 1 lingers 60 s inside the step-4 save, after its files and before the barrier
    launch = Launch(run, 2, env={"TAEHV_FAULTS": "ckpt_sleep:1:4:60"})
    wait_for(
        lambda: (run / "checkpoints" / "step-4.tmp" / "trainer" / "rank-1.pt").exists(),
        180,
        "rank 1 inside the step-4 save",
        launch,
    )
    pid = json.loads((run / "heartbeat" / "rank-1.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    rc = launch.wait(120)
    assert rc != 0
    assert (run / "checkpoints" / "step-4.tmp").is_dir() and not (run / "checkpoints" / "step-4").exists()
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-2"
    # resume takes step-2, reports the .tmp, and runs to the end
    run_to_end(run, 2, args=("--resume", "latest"))
    start = events(run, 0, "start")[-1]
    assert start["resumed_from"].endswith("step-2")
    assert any("step-4.tmp" in s for s in start["skipped_checkpoints"])
    assert events(run, 0, "stop")[-1]["reason"] == "done"
    assert ckpt.scan(run / "checkpoints").newest.step == 6
    assert not (run / "checkpoints" / "step-4.tmp").exists()  # the abandoned one is cleaned after a good save


def test_collective_timeout_is_the_process_group_timeout(tmp_path, clip_dir):
    run = write_run(
        tmp_path / "run",
        base_config(clip_dir, distributed={"collective_timeout_s": 5}, optim={"max_steps": 4}),
    )
    launch = Launch(run, 2, env={"TAEHV_FAULTS": "stall:1:2:90"})
    rc = launch.wait(200)
    assert rc != 0
    log = launch.log.read_text(errors="replace")
    assert "imed out" in log or "Timeout" in log or "timeout" in log, launch.tail()
    # rank 0 gave up long before rank 1's 90 s stall (from step 2 on) ended: the 5 s timeout
    # applied, not a default. Timed from rank 0's own events, so a slow start on a busy machine
    # does not count (the whole launch took over 85 s once under load)
    before = max(e["time"] for e in events(run, 0) if e["kind"] in ("start", "step"))
    (error,) = events(run, 0, "error")
    assert "imed out" in error["message"] or "imeout" in error["message"], error
    assert error["time"] - before < 45, (error["time"] - before, launch.tail())


def test_world_size_change_on_resume_is_refused_with_the_supported_paths(zero2_run, tmp_path):
    run = tmp_path / "run"
    write_run(
        run,
        {
            **load_config(zero2_run / "run.toml").model_dump(mode="json"),
            "topology": {"nodes": 1, "gpus_per_node": 1, "device": "cpu"},
        },
    )
    shutil.copytree(zero2_run / "checkpoints" / "step-3", run / "checkpoints" / "step-3")
    launch = Launch(run, 1, args=("--resume", "latest"))
    assert launch.wait() != 0  # the rank exits 2; torchrun reports any failed rank as 1
    log = launch.log.read_text()
    assert "ds_to_universal" in log and "--weights-only" in log
    # the weights-only path works at the new world size
    run_to_end(run, 1, args=("--resume", "latest", "--weights-only"))
    assert events(run, 0, "step")[0]["step"] == 4


# ---------------------------------------------------------------- bf16: no host sync per micro-batch


@pytest.mark.parametrize("stage", [2, 3])
def test_bf16_zero_leaves_a_nan_to_deepspeed_and_skips_the_step(tmp_path, clip_dir, stage):
    """Under ZeRO-2 and ZeRO-3 with bf16 the trainer reads nothing back between forward and
    backward: a non-finite loss reaches the gradients, DeepSpeed's overflow check skips that update
    on every rank, and the trainer counts it. The weights stay finite (an update with NaN gradients
    would make them NaN) and training goes on."""
    from safetensors.torch import load_file

    run = write_run(
        tmp_path / "run",
        base_config(clip_dir, data=BF16_CROP, deepspeed={"zero_stage": stage, "mixed_precision": "bf16"}),
    )
    run_to_end(run, 2, env={"TAEHV_FAULTS": "nan:1:2"})
    start = events(run, 0, "start")[0]
    assert start["precision"] == "bf16" and start["nonfinite_guard"] == "deepspeed-step", start
    steps = events(run, 0, "step")
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5, 6]
    assert [e["nonfinite_skipped"] for e in steps] == [0, 0, 1, 1, 1, 1]
    assert all(math.isfinite(e["loss"]) for e in steps)
    weights = load_file(str(run / "final" / "taehv.safetensors"))
    assert all(torch.isfinite(w).all() for w in weights.values())
    effective = json.loads((run / "deepspeed.effective.json").read_text())
    assert effective["bf16"] == {"enabled": True, "check_grad_overflow": True}


# ---------------------------------------------------------------- several crops per decoded clip


def test_crops_per_clip_trains_and_resumes_at_the_same_data(tmp_path, clip_dir):
    """data.crops_per_clip = 2 with 2 clips per micro-batch: each micro-batch is one decoded clip cut
    twice. The data position counts sampler items (one per decode), so a resume from step 3 goes on
    with exactly the batches of the uninterrupted run."""
    cfg = base_config(clip_dir, data={"crops_per_clip": 2}, optim={"batch_per_gpu": 2})
    run = write_run(tmp_path / "run", cfg)
    run_to_end(run, 2)
    rank0 = torch.load(run / "checkpoints" / "step-6" / ckpt.rank_state_name(0), weights_only=True)
    assert rank0["samples_consumed"] == 6 * 2 * 2 // 2  # steps x accumulation x clips / crops per item
    resumed = write_run(tmp_path / "resumed", cfg)
    shutil.copytree(run / "checkpoints" / "step-3", resumed / "checkpoints" / "step-3")
    run_to_end(resumed, 2, args=("--resume", "latest"))
    a = {e["step"]: e for e in events(run, 0, "step")}
    b = {e["step"]: e for e in events(resumed, 0, "step")}
    assert sorted(b) == [4, 5, 6]
    for s in (4, 5, 6):
        assert math.isclose(b[s]["loss"], a[s]["loss"], rel_tol=1e-3, abs_tol=1e-6), (
            s,
            a[s]["loss"],
            b[s]["loss"],
        )
