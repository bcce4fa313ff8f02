"""benchmarks/gpu_throughput.py: its FLOP count and peaks, checked against the model counted on
meta and the datasheets; and, in CI, a tiny CPU run of every section that runs without CUDA (grid
eager, the trainer's real train_step under ZeRO-2, profile, input costs, crop), whose JSON lines
must parse and carry their keys, while the CUDA-only parts say "no CUDA" instead of failing."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from trainer.model import TAEHV, reconstruction_target

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_throughput.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}


def _bench():
    spec = importlib.util.spec_from_file_location("gpu_throughput", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _rows(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_flop_count_and_mfu_follow_the_facts():
    b = _bench()
    # FACTS' 6.1 TFLOP is 3 x the published forward; the trainer's count (the decoder's last two
    # convolutions on the 9 frames decode keeps, each TGrow before its upsample) is 6 % less
    assert b.flop_per_clip_step(12, 480, 720) == pytest.approx(6.1e12, rel=0.07)
    assert b.flop_per_clip_step(12, 64, 64) == pytest.approx(
        b.flop_per_clip_step(12, 480, 720) * 64 * 64 / (480 * 720), rel=1e-3
    )
    # the arithmetic: ~65 clips/s per H100 at 40 % MFU
    assert 65 * b.flop_per_clip_step(12, 480, 720) / b.H100_BF16_PEAK == pytest.approx(0.40, abs=0.03)
    # distillation decodes the teacher's latents too: ~1.7x a reconstruction step (the figure)
    ratio = b.flop_per_clip_step(12, 480, 720, teacher_decode=True) / b.flop_per_clip_step(12, 480, 720)
    assert ratio == pytest.approx(1.69, abs=0.02)


def _counted_on_meta(teacher_decode: bool) -> int:
    """FLOPs of one training step of one 12x480x720 clip of the author's model (in the trainer's
    order, tests/trainer/test_family_flops.py does every family), counted by torch on the meta device: forward and backward of encode and decode, and of a second
    decode of teacher-shaped latents for the distillation step."""
    with torch.device("meta"):
        model = TAEHV().to(torch.bfloat16).train()
        x = torch.rand(1, 12, 3, 480, 720, dtype=torch.bfloat16)
        latents = torch.rand(1, 3, 16, 60, 90, dtype=torch.bfloat16)
    counter = FlopCounterMode(display=False)
    with counter:
        z, y = model(x, clamp=False)
        loss = F.mse_loss(y.float(), reconstruction_target(x, y.shape[1]).float())
        if teacher_decode:
            y_t = model.decode(latents, clamp=False)
            loss = loss + F.mse_loss(z.float(), latents.float()) + F.mse_loss(y_t.float(), y.float())
        loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("teacher_decode", [False, True])
def test_flop_count_is_the_models_forward_and_backward_of_encode_and_decode(teacher_decode):
    b = _bench()
    counted = _counted_on_meta(teacher_decode)
    assert b.flop_per_clip_step(12, 480, 720, teacher_decode) == counted


def test_datasheet_peak_is_that_of_the_exact_model():
    b = _bench()
    peak = lambda name: b.datasheet_peak(name)[0]
    assert peak("NVIDIA H100 80GB HBM3") == 989  # SXM
    assert peak("NVIDIA H100 PCIe") == 756
    assert peak("NVIDIA H100 NVL") == 835
    assert peak("NVIDIA H200") == 989
    assert peak("NVIDIA A100-SXM4-80GB") == 312
    assert peak("NVIDIA A800-SXM4-80GB") == 312
    assert peak("NVIDIA L40S") == 362
    unknown, why = b.datasheet_peak("Some GPU")
    assert unknown is None and "Some GPU" in why


def test_profile_sorts_kernels_by_what_they_do_and_counts_busy_time_once():
    _bench()  # puts benchmarks/ on the path
    from _throughput_core import busy_time, kernel_kind

    names = {
        "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64": "conv",
        "sm80_xmma_wgrad_implicit_gemm_indexed_bf16bf16_bf16f32_f32_nhwckrsc_nhwc": "conv",
        "void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16>": "layout",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64": "gemm",
        "triton_poi_fused_relu_threshold_backward_0": "elementwise",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>": "elementwise",
        "Memcpy HtoD (Pinned -> Device)": "memcpy",
        "void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>": "optimizer",
    }
    assert {n: kernel_kind(n) for n in names} == names
    # overlapping kernels (two streams) count once; the gap between them is idle
    assert busy_time([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == 4.0
    assert busy_time([]) == 0.0


def test_an_unknown_section_is_named():
    r = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--only", "grid,nosuch"],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert r.returncode == 2 and "nosuch" in r.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tiny_cpu_run_of_every_section_prints_its_figures(tmp_path):
    out = tmp_path / "out"
    only = "env,matmul,grid,trainer,profile,input,crop"
    r = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--tiny",
            "--only",
            only,
            "--zero",
            "2",
            # the grid's cells for the reconstruction step and distillation on cached latents
            "--step",
            "recon,distill",
            # the trainer's run.toml carries it (compile itself is CUDA-only here): it must validate
            "--compile-mode",
            "max-autotune-no-cudagraphs",
            # a loader worker in the trainer's child, as on a GPU node: its workers ignore SIGTERM,
            # which once held the child's exit until the section's time limit stopped it
            "--workers",
            "1",
            "--time-limit-s",
            "420",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=560,
        env=ENV,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = _rows(r.stdout)
    assert [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()] == rows
    assert not [row for row in rows if "error" in row or "stopped" in row]
    by = lambda section: [row for row in rows if row["section"] == section]

    (env,) = by("env")
    assert env["torch"] == torch.__version__ and env["clip"] == "4x32x48"
    assert by("matmul") == [{"section": "matmul", "skipped": "no CUDA"}]

    grid = by("grid")
    cells = [row for row in grid if "clips_per_s" in row]
    assert sorted((c["layout"], c["batch"], c["step"]) for c in cells) == sorted(
        (lay, b, step) for lay in ("nchw", "channels_last") for b in (1, 2) for step in ("recon", "distill")
    )
    # distillation also decodes the teacher's latents: 1.64x the reconstruction step's FLOPs at this
    # clip (1.67x at 12x480x720: a 4-frame clip keeps 1 of its 4 decoded frames, fewer than 9 of 12)
    flops = {(c["layout"], c["batch"], c["step"]): c["tflop_per_clip_step"] for c in cells}
    assert flops["nchw", 1, "distill"] == pytest.approx(1.64 * flops["nchw", 1, "recon"], rel=0.02)
    for c in cells:
        assert c["mode"] == "eager" and c["clips_per_s"] > 0
        assert c["step_ms_p90"] >= c["step_ms_median"] > 0
        assert c["forward_ms"] > 0 and c["backward_ms"] > 0 and c["optimizer_ms"] > 0
        assert c["tflop_per_clip_step"] > 0 and "mfu_datasheet" in c and "peak_mem_gb" in c
    skipped = [row["skipped"] for row in grid if "skipped" in row]
    assert any("no CUDA" in s for s in skipped) and len(skipped) == 3  # compile, and max for 2 layouts

    step, syncs, profiled = by("trainer")
    assert step["zero"] == 2 and step["clips_per_s"] > 0 and step["ratio_to_bare"] > 0
    assert step["bare_clips_per_s"] > 0 and "no CUDA" in step["prefetch"]
    assert step["trainer_peak_tflops"] is None  # on CPU the trainer reports no MFU
    assert step["loader_workers"] == 1
    assert syncs["what"] == "host syncs per optimizer step" and syncs["cuda_sync_debug_per_step"] == "no CUDA"
    # fp32 on CPU: the trainer reads each micro-batch's loss (the GPU's bf16 loop does not)
    assert syncs["trainer_per_step"] > 0 and any("train.py" in site for site in syncs["hooked_sites"])

    # one real train_step profiled, as the bare loop's step below: its kernels and the host's work
    assert profiled["what"] == "profiled step" and profiled["zero"] == 2
    assert Path(profiled["trace"]).is_file() and profiled["kernels"] > 0 and profiled["top_kernels"]
    assert any(h["self_cpu_ms"] > 0 for h in profiled["host_top"])

    (profile,) = by("profile")
    assert Path(profile["trace"]).is_file() and profile["kernels"] > 0
    assert 0 <= profile["idle_share"] <= 1 and profile["top_kernels"] and profile["host_top"]

    inputs = {row["what"]: row for row in by("input")}
    assert inputs["H2D uint8 batch"]["skipped"] == "no CUDA"
    assert inputs["jitter: trainer.augment.to_model_input"]["ms"] > 0
    assert "TINY" in inputs["teacher encode per clip"]["teacher"]
    assert inputs["loader"]["load_cpu_s"] > 0 and inputs["loader"]["clips_per_s_measured"] > 0

    crop = [row for row in by("crop") if "clips_per_s" in row]
    assert [(c["batch"], c["clip"]) for c in crop] == [(2, "4x16x16"), (4, "4x16x16")]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_time_limit_stops_a_section_and_keeps_what_it_printed(tmp_path):
    args = ["--device", "cpu", "--only", "grid,crop", "--size", "4x32x48", "--batches", "1"]
    args += ["--layouts", "nchw", "--modes", "eager", "--steps", "100000", "--time-limit-s", "8"]
    r = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = _rows(r.stdout)
    assert [row["section"] for row in rows] == ["grid", "crop"]
    assert "time limit" in rows[0]["stopped"] and "time limit" in rows[1]["skipped"]
