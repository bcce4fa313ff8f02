"""The pieces of benchmarks/gpu_throughput.py that every section uses: FLOPs per clip-step, the
datasheet peaks, the JSON-line output, per-phase timing from CUDA events, and the bare training
loop (the trainer's step without accelerate, DeepSpeed, jitter, loader or heartbeats)."""

from __future__ import annotations

import functools
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import itertools

from trainer.augment import to_model_input
from trainer.flops import H100_BF16_PEAK, datasheet_peak, flop_per_clip_step  # noqa: F401 (re-exported)
from trainer.model import TAEHV, reconstruction_target


class OutOfTime(Exception):
    """The run's time limit (SIGALRM) fell inside a section."""


def is_oom(err: BaseException) -> bool:
    """Out of device memory, whether torch or cuDNN (a failed workspace allocation) says so."""
    text = str(err)
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in text or "ALLOC_FAILED" in text


def cell_or_error(fn: Any, *a: Any, **k: Any) -> dict[str, Any]:
    """fn's figures, or {"error": ...}: one failed measurement must not lose the rest of a section."""
    try:
        return fn(*a, **k)
    except OutOfTime:
        raise
    except Exception as err:  # reported in the results, and the section goes on
        if _caused_by_out_of_time(err):  # the alarm fell inside Inductor, which wraps what it catches
            raise OutOfTime from err
        return {"error": f"{type(err).__name__}: {err}"[:500]}


def _caused_by_out_of_time(err: BaseException) -> bool:
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, OutOfTime) or type(seen).__name__ == "OutOfTime" or "OutOfTime" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class Out:
    """One JSON object a line on stdout, flushed, and appended to OUT/results.jsonl: a run cut short
    by a time limit still leaves every figure printed so far."""

    def __init__(self, out_dir: Path):
        self.dir = out_dir
        out_dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / "results.jsonl"

    def emit(self, section: str, **fields: Any) -> dict[str, Any]:
        row = {"section": section, **fields}
        line = json.dumps(row, default=str)
        print(line, flush=True)
        with self.path.open("a") as f:
            f.write(line + "\n")
        return row


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Marks:
    """Time points within each step: CUDA events on a GPU (no host wait inside a step), perf_counter
    on CPU (where work is synchronous anyway)."""

    def __init__(self, device: str):
        self.cuda = device == "cuda"
        self.rows: list[list[Any]] = []

    def _now(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def start(self) -> None:
        self.rows.append([self._now()])

    def mark(self) -> None:
        self.rows[-1].append(self._now())

    def ms(self) -> list[list[float]]:
        """Per step, the milliseconds of each phase (between consecutive marks)."""
        if self.cuda:
            torch.cuda.synchronize()
            return [[a.elapsed_time(b) for a, b in itertools.pairwise(r)] for r in self.rows]
        return [[(b - a) * 1e3 for a, b in itertools.pairwise(r)] for r in self.rows]

    def span_ms(self) -> float:
        """From the first step's start to the last step's end."""
        first, last = self.rows[0][0], self.rows[-1][-1]
        return first.elapsed_time(last) if self.cuda else (last - first) * 1e3


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def throughput(clips_per_step: int, step_ms: list[float], span_ms: float, flop: float, args: Any) -> dict:
    """clips/s, median/p90 step and MFU against the datasheet and the measured matmul peak."""
    clips_per_s = clips_per_step * len(step_ms) / (span_ms / 1e3)
    achieved = clips_per_s * flop / 1e12
    row: dict[str, Any] = {
        "clips_per_s": round(clips_per_s, 3),
        "step_ms_median": round(statistics.median(step_ms), 3),
        "step_ms_p90": round(p90(step_ms), 3),
        "tflop_per_clip_step": round(flop / 1e12, 4),
        "achieved_tflops": round(achieved, 3),
    }
    for key, peak in (("mfu_datasheet", args.datasheet_tflops), ("mfu_measured", args.measured_tflops)):
        row[key] = round(achieved / peak, 4) if peak else None
    return row


def memory(device: str) -> dict[str, float | None]:
    if device != "cuda":
        return {"peak_mem_gb": None}
    return {
        "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 1e9, 3),
        "peak_reserved_gb": round(torch.cuda.max_memory_reserved() / 1e9, 3),
    }


def free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def dynamo_counts() -> dict[str, Any]:
    """Graph breaks (with their commonest reasons) and graphs compiled since the last reset."""
    from torch._dynamo.utils import counters

    breaks = counters["graph_break"]
    return {
        "graph_breaks": int(sum(breaks.values())),
        "graph_break_reasons": [r[:160] for r, _n in breaks.most_common(3)],
        "graphs": int(counters["stats"].get("unique_graphs", 0)),
    }


def build_bare(
    layout: str, compiled: bool, device: str, compile_mode: str = "default"
) -> tuple[TAEHV, torch.optim.Optimizer]:
    """TAEHV with AdamW (fp32 weights, fused on CUDA) in the trainer's execution settings
    (`compile_mode`: torch.compile's mode, as model.compile_mode sets it)."""
    torch.manual_seed(0)
    model = TAEHV().to(device).train()
    if layout == "channels_last":
        model.use_channels_last()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), fused=device == "cuda")
    if compiled:
        # per-stage compile (forward, encode and decode on teacher latents alike) where the model has it
        if hasattr(model, "compile_stages"):
            model.compile_stages(mode=compile_mode)
        else:
            model.compile(mode=compile_mode)
    return model, opt


def clip_batch(batch: int, frames: int, h: int, w: int, device: str, pin: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (batch, frames, 3, h, w), dtype=torch.uint8, generator=g)
    return x.pin_memory() if pin else x.to(device)


def teacher_like_latents(video: torch.Tensor) -> torch.Tensor:
    """Random latents of the student's shape (N x T/4 x 16 x H/8 x W/8): a cached teacher's input."""
    n, t, _c, h, w = video.shape
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, t // 4, 16, h // 8, w // 8, generator=g).to(video.device)


def bare_step(
    model: TAEHV,
    opt: torch.optim.Optimizer,
    video_u8: torch.Tensor,
    args: Any,
    marks: Marks | None = None,
    latents: torch.Tensor | None = None,
) -> None:
    """The trainer's micro-batch without DeepSpeed: uint8 -> model input on the device (no jitter),
    bf16 autocast forward, fp32 MSE of the unclamped output; with `latents`, the distillation recipe
    (encoder MSE to them, and the decoder run on them too). Then backward and AdamW."""
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    mark = marks.mark if marks else (lambda: None)
    if marks:
        marks.start()
    x = to_model_input(video_u8, dtype)
    mark()  # input
    with torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.bf16):
        z, y = model(x, clamp=False)
        loss = F.mse_loss(y.float(), reconstruction_target(x, y.shape[1]).float())
        if latents is not None:
            y_t = model.decode(latents.to(z.dtype), clamp=False)
            loss = (
                loss
                + F.mse_loss(z.float(), latents)
                + F.mse_loss(y_t.float(), reconstruction_target(x, y_t.shape[1]).float())
            )
    mark()  # forward
    loss.backward()
    mark()  # backward
    opt.step()
    opt.zero_grad(set_to_none=True)
    mark()  # optimizer


PHASES = ("input_ms", "forward_ms", "backward_ms", "optimizer_ms")


def measure_bare(
    layout: str, mode: str, batch: int, size: tuple[int, int, int], args: Any, distill: bool = False
) -> dict:
    """Warm-up then `args.steps` timed steps of the bare loop: the figures of one grid cell (its
    layout, mode and batch are the caller's to print). Out of memory gives {"oom": True}, freed."""
    frames, h, w = size
    cell: dict[str, Any] = {"clip": f"{frames}x{h}x{w}", "step": "distill" if distill else "recon"}
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # each compiled cell compiles afresh: its compile_s is its own
    counters.clear()
    free(args.device)
    try:
        model, opt = build_bare(layout, mode == "compile", args.device, args.compile_mode)
        video = clip_batch(batch, frames, h, w, args.device)
        latents = teacher_like_latents(video) if distill else None
        t0 = time.perf_counter()
        bare_step(model, opt, video, args, latents=latents)
        sync(args.device)
        first_s = time.perf_counter() - t0
        for _ in range(args.warmup - 1):
            bare_step(model, opt, video, args, latents=latents)
        sync(args.device)
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        marks = Marks(args.device)
        for _ in range(args.steps):
            bare_step(model, opt, video, args, marks, latents)
        phases = marks.ms()
    except RuntimeError as err:
        if not is_oom(err):
            raise
        cell["oom"] = True
    if cell.get("oom"):
        model = opt = video = latents = None  # type: ignore[assignment]
        free(args.device)
        return cell
    steps = [sum(p) for p in phases]
    cell.update(throughput(batch, steps, marks.span_ms(), flop_per_clip_step(frames, h, w, distill), args))
    cell.update({k: round(statistics.median(p[i] for p in phases), 3) for i, k in enumerate(PHASES)})
    cell.update(memory(args.device))
    cell["first_step_s"] = round(first_s, 3)
    if mode == "compile":
        cell["compile_mode"] = args.compile_mode
        cell["compile_s"] = round(first_s - cell["step_ms_median"] / 1e3, 3)
        cell.update(dynamo_counts())
    del model, opt, video, latents
    free(args.device)
    return cell


@functools.cache
def measured_matmul_tflops(n: int = 8192, iters: int = 20) -> float:
    """bf16 n x n matmuls on the GPU, TFLOP/s (2 n^3 per product)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (start.elapsed_time(end) / 1e3) / 1e12


def kernel_kind(name: str) -> str:
    """What a profiled kernel (or CPU operator) does, by its name."""
    n = name.lower()
    if "memcpy" in n or "memset" in n:
        return "memcpy"
    if "nchwtonhwc" in n or "nhwctonchw" in n:
        return "layout"
    if any(k in n for k in ("conv", "cudnn", "implicit_gemm", "fprop", "dgrad", "wgrad", "winograd")):
        return "conv"
    if "gemm" in n or "cublas" in n or "aten::mm" in n:
        return "gemm"
    if "adam" in n or "multi_tensor" in n:
        return "optimizer"
    return "elementwise"  # elementwise, reductions, copies, cat, upsample, fused triton kernels


def busy_time(spans: list[tuple[float, float]]) -> float:
    """The time covered by the union of sorted (start, end) spans: when the device ran anything."""
    busy, cur_s, cur_e = 0.0, 0.0, None
    for s, e in spans:
        if cur_e is None or s > cur_e:
            busy += 0.0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return busy + (0.0 if cur_e is None else cur_e - cur_s)
