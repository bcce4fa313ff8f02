"""One GPU session, every figure: TAEHV training throughput per GPU, as JSON lines.

Sections (each selectable with --only, each bounded by --time-limit-s, results flushed as they come):
  env      the GPU, versions, the datasheet bf16 dense peak for that exact model
  matmul   measured bf16 matmul TFLOP/s and device copy GB/s (CUDA only)
  grid     the bare loop over {NCHW, channels_last} x {eager, compile} x batch {4, 8, max}: clips/s,
           median/p90 step, forward/backward/optimizer ms, MFU on both peaks, peak memory, compile s,
           graph breaks
  trainer  the real Trainer.train_step under one-rank DeepSpeed ZeRO-2, ZeRO-3 and ZeRO-1 (grad_accum
           2), each in its own process: ratio to the bare loop, host syncs per step with call sites
  profile  one profiled step: top kernels, conv/elementwise/memcpy/idle shares, trace in --out
  input    H2D of a uint8 batch, jitter (to_model_input), teacher encode per clip, the loader
  crop     the author's 12x64x64 crop recipe at batch 64 and 256

    python benchmarks/gpu_throughput.py --only env,matmul,grid --out OUT --time-limit-s 420
    python benchmarks/gpu_throughput.py --only env,trainer,profile,input,crop --out OUT --time-limit-s 400
    python benchmarks/gpu_throughput.py --device cpu --tiny      # CI smoke: untimed, tiny clips

MFU counts 6.1 TFLOP per 12x480x720 clip-step (FACTS: forward 2.04 TFLOP, backward twice that; the
distillation step's decode of teacher latents adds the decoder's 69 %), scaled by frames x pixels.
docs/performance.md says what every key means.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from _throughput_core import (
    H100_BF16_PEAK,
    Out,
    OutOfTime,
    cell_or_error,
    datasheet_peak,
    flop_per_clip_step,
    measure_bare,
    measured_matmul_tflops,
)

from trainer.hard_exit import exit_now

__all__ = ["H100_BF16_PEAK", "flop_per_clip_step", "main"]

FULL = (12, 480, 720)
TINY = (4, 32, 48)
SECTIONS = ("env", "matmul", "grid", "trainer", "profile", "input", "crop")


def _alarm(_signum: int, _frame: FrameType | None) -> None:
    raise OutOfTime


# ---------------------------------------------------------------- env and matmul
def _driver_and_nvml_name() -> tuple[str | None, str | None]:
    try:
        r = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,name", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        driver, name = (s.strip() for s in r.stdout.strip().splitlines()[0].split(",", 1))
        return driver, name
    except (OSError, IndexError, ValueError, subprocess.SubprocessError):
        return None, None


def _nccl_version() -> str:
    v = torch.cuda.nccl.version()  # a tuple in recent torch, an int in old ones
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def section_env(args: Any, out: Out) -> None:
    try:
        import deepspeed

        ds_version = deepspeed.__version__
    except Exception as err:  # noqa: BLE001 - a version line, never a failure
        ds_version = f"unavailable ({type(err).__name__})"
    row: dict[str, Any] = {
        "device": args.device,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "deepspeed": ds_version,
        "cpu_count": os.cpu_count(),
        "out_dir": str(args.out),
        "clip": "x".join(map(str, args.size)),
        "tiny": args.tiny,
    }
    if args.device == "cuda":
        driver, nvml_name = _driver_and_nvml_name()
        props = torch.cuda.get_device_properties(0)
        row.update(
            gpu=torch.cuda.get_device_name(0),
            nvml_name=nvml_name,
            driver=driver,
            cudnn=torch.backends.cudnn.version(),
            nccl=_nccl_version(),
            gpu_memory_gb=round(props.total_memory / 1e9, 2),
            sm_count=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
        )
    row["tflop_per_clip_step"] = round(flop_per_clip_step(*args.size) / 1e12, 4)
    row["goal"] = "at least 50 clips/s per H100 at 12x480x720 (about 31 % MFU at 989 TFLOP/s)"
    row.update(datasheet_bf16_dense_tflops=args.datasheet_tflops, datasheet_source=args.datasheet_source)
    out.emit("env", **row)


def section_matmul(args: Any, out: Out) -> None:
    if args.device != "cuda":
        out.emit("matmul", skipped="no CUDA")
        return
    for n in (4096, 8192, 16384):
        out.emit("matmul", what="bf16 matmul", n=n, tflops=round(measured_matmul_tflops(n), 1))
    size = 1 << 30
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters = 20
    start.record()
    for _ in range(iters):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    out.emit(
        "matmul",
        what="device copy (1 GiB, read + write counted)",
        copy_gb_s=round(2 * size * iters / seconds / 1e9, 1),
        measured_peak_tflops=args.measured_tflops,
    )


# ---------------------------------------------------------------- the grid
def max_batch(layout: str, size: tuple[int, int, int], args: Any, start: int) -> int | None:
    """The largest batch whose eager step fits, by doubling from `start` and then bisecting (one
    step per try). None when even `start` does not fit."""
    fits = lambda b: not measure_bare(layout, "eager", b, size, _one_step(args)).get("oom")
    if not fits(start):
        return None
    lo, hi = start, start * 2
    while hi <= args.max_batch_cap and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, args.max_batch_cap + 1)
    while hi - lo > max(1, lo // 8):
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _one_step(args: Any) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(args), "steps": 1, "warmup": 1})


def section_grid(args: Any, out: Out) -> None:
    modes = args.modes
    if args.device != "cuda" and "compile" in modes:
        out.emit(
            "grid",
            mode="compile",
            skipped="no CUDA (inductor on CPU takes minutes; tests/trainer/test_compile.py covers it)",
        )
        modes = [m for m in modes if m != "compile"]
    maxes: dict[str, int | None] = {}
    # eager first (cheap), then compile: a time limit leaves the most figures
    for mode in [m for m in ("eager", "compile") if m in modes]:
        for batch_spec in args.batches:
            for layout in args.layouts:
                if batch_spec == "max":
                    if args.device != "cuda":
                        out.emit(
                            "grid",
                            layout=layout,
                            mode=mode,
                            batch="max",
                            skipped="no CUDA (found by running out of memory)",
                        )
                        continue
                    if layout not in maxes:
                        maxes[layout] = max_batch(layout, args.size, args, start=8)
                        out.emit(
                            "grid", layout=layout, what="max batch (eager, one step)", max_batch=maxes[layout]
                        )
                    if maxes[layout] is None:
                        continue
                    batch = int(maxes[layout] or 0)
                else:
                    batch = int(batch_spec)
                # recon, then distill on cached latents where asked: in one process the compiled
                # stages' graphs serve both (the teacher's latents have the student's shape)
                for kind in args.step:
                    _grid_cell(out, args, layout, mode, batch, batch_spec == "max", kind == "distill")


def _grid_cell(
    out: Out, args: argparse.Namespace, layout: str, mode: str, batch: int, at_max: bool, distill: bool
):
    cell = cell_or_error(measure_bare, layout, mode, batch, args.size, args, distill)
    # The search's two steps can fit where the timed loop does not (on an H100, 14 clips fitted two
    # steps and the timed loop ran out of memory): step down, a few times.
    tries = 3 if at_max else 0
    while cell.get("oom") and tries and batch > 1:
        out.emit("grid", layout=layout, mode=mode, batch=batch, **cell, max_batch=True)
        batch, tries = batch - 1, tries - 1
        cell = cell_or_error(measure_bare, layout, mode, batch, args.size, args, distill)
    out.emit("grid", layout=layout, mode=mode, batch=batch, **cell, max_batch=at_max)


# ---------------------------------------------------------------- the session
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections, of: {', '.join(SECTIONS)}"
    )
    p.add_argument(
        "--out",
        type=Path,
        help="results.jsonl and the profiler trace go here (default: a new temporary folder)",
    )
    p.add_argument(
        "--time-limit-s",
        type=float,
        default=570,
        help="the whole run; sections past it are stopped or skipped",
    )
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument(
        "--tiny", action="store_true", help="tiny clips and batches, 2 steps: a smoke run, untimed"
    )
    p.add_argument("--no-bf16", dest="bf16", action="store_false", help="fp32 (the default on CPU)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--size", default="12x480x720", help="frames x height x width of a clip")
    p.add_argument(
        "--layouts", default="channels_last,nchw", help="the first goes first (the presets' layout)"
    )
    p.add_argument("--modes", default="eager,compile")
    p.add_argument(
        "--compile-mode",
        default="default",
        choices=("default", "max-autotune-no-cudagraphs"),
        help="torch.compile's mode for every compiled part, the trainer's included (model.compile_mode)",
    )
    p.add_argument("--batches", default="4,8,max")
    p.add_argument("--max-batch-cap", type=int, default=64, help="the max-batch search stops here")
    p.add_argument(
        "--step",
        default="recon",
        help="grid: recon (the reconstruction step), distill (distillation on cached latents: encode, "
        "decode, decode of the latents), or both: recon,distill",
    )
    p.add_argument(
        "--zero", default="2,3,1", help="trainer: ZeRO stages, one process each (ZeRO-1 accumulates 2)"
    )
    p.add_argument("--trainer-batch", type=int, default=4)
    p.add_argument("--trainer-layout", default="channels_last", choices=("nchw", "channels_last"))
    p.add_argument(
        "--trainer-compile", action="store_true", help="trainer: model.compile = true (as the GPU presets)"
    )
    p.add_argument("--trainer-child", type=int, help=argparse.SUPPRESS)
    p.add_argument("--profile-layout", default="channels_last", choices=("nchw", "channels_last"))
    p.add_argument("--profile-mode", default="eager", choices=("eager", "compile"))
    p.add_argument("--profile-batch", type=int, default=4)
    p.add_argument("--workers", type=int, help="loader processes (default: the node's cores, less one)")
    p.add_argument("--data", type=Path, help="a directory of clips for the loader (default: synthetic clips)")
    p.add_argument(
        "--teacher",
        type=Path,
        help="a diffusers AutoencoderKLHunyuanVideo directory (default: its architecture, random weights)",
    )
    args = p.parse_args(argv)
    args.sections = [s for s in args.only.split(",") if s]
    unknown = set(args.sections) - set(SECTIONS)
    for name, allowed in (("layouts", {"nchw", "channels_last"}), ("modes", {"eager", "compile"})):
        setattr(args, name, getattr(args, name).split(","))
        unknown |= set(getattr(args, name)) - allowed
    args.batches = args.batches.split(",")
    unknown |= {b for b in args.batches if b != "max" and not b.isdigit()}
    args.step = args.step.split(",")
    unknown |= set(args.step) - {"recon", "distill"}
    if unknown:
        p.error(f"unknown section, layout, mode, batch or step: {', '.join(sorted(unknown))}")
    try:
        args.size = FULL if args.size == "12x480x720" else tuple(int(v) for v in args.size.split("x"))
        assert (
            len(args.size) == 3 and args.size[0] % 4 == 0 and args.size[1] % 8 == 0 and args.size[2] % 8 == 0
        )
    except (ValueError, AssertionError):
        p.error(f"--size {args.size!r}: want FRAMESxHEIGHTxWIDTH, frames a multiple of 4, sides of 8")
    if args.device == "cpu":
        args.bf16 = False
    if args.tiny:
        args.size, args.steps, args.warmup = TINY, 2, 1
        args.batches = ["1", "2", "max"]
        args.trainer_batch = args.profile_batch = 1
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here; use --device cpu --tiny for the smoke run")
    if args.device == "cuda":
        torch.backends.cudnn.benchmark = True  # as the trainer's runtime sets it
    args.out = args.out or Path(tempfile.mkdtemp(prefix="gpu_throughput-"))
    out = Out(args.out)
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    args.datasheet_tflops, args.datasheet_source = datasheet_peak(name)
    args.measured_tflops = None
    deadline = time.monotonic() + args.time_limit_s
    signal.signal(signal.SIGALRM, _alarm)
    from _throughput_sections import SECTION_RUNNERS

    runners = {"env": section_env, "matmul": section_matmul, "grid": section_grid, **SECTION_RUNNERS}
    failed = 0
    for section in [s for s in SECTIONS if s in args.sections]:
        left = deadline - time.monotonic()
        if left < 5:
            out.emit(section, skipped=f"time limit ({args.time_limit_s:.0f} s) reached before it started")
            continue
        args.deadline = deadline
        signal.alarm(max(1, int(left)))
        try:
            if args.device == "cuda" and args.measured_tflops is None and section != "env":
                # MFU's second peak: the best bf16 matmul rate this GPU reaches
                args.measured_tflops = round(max(measured_matmul_tflops(n) for n in (8192, 16384)), 1)
            runners[section](args, out)
        except OutOfTime:
            out.emit(
                section,
                stopped=f"time limit ({args.time_limit_s:.0f} s): the lines above are what it measured",
            )
        except Exception as err:  # noqa: BLE001 - one failed section must not lose the others' figures
            failed += 1
            tb = traceback.format_exc().strip().splitlines()
            out.emit(section, error=f"{type(err).__name__}: {err}"[:500], traceback=tb[-8:])
        finally:
            signal.alarm(0)
    return 1 if failed else 0


if __name__ == "__main__":
    # out as a rank leaves (trainer.hard_exit): the trainer section's child ran gloo collectives, and
    # its loader's workers ignore SIGTERM, which held a plain exit forever after its last figure
    exit_now(main())
