"""benchmarks/gpu_throughput.py's trainer, profile, input and crop sections (see its docstring)."""

from __future__ import annotations

import collections
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from _throughput_core import (
    Marks,
    Out,
    bare_step,
    build_bare,
    busy_time,
    cell_or_error,
    clip_batch,
    flop_per_clip_step,
    free,
    kernel_kind,
    measure_bare,
    memory,
    sync,
    throughput,
)

SCRIPT = Path(__file__).resolve().parent / "gpu_throughput.py"
CROP, CROP_TINY = (12, 64, 64), (4, 16, 16)


def _timed_ms(fn: Callable[[], Any], device: str, reps: int) -> float:
    """Median milliseconds of `fn` over `reps` calls after one warm-up call."""
    fn()
    marks = Marks(device)
    for _ in range(reps):
        marks.start()
        fn()
        marks.mark()
    return round(statistics.median(r[0] for r in marks.ms()), 3)


# ---------------------------------------------------------------- trainer
def section_trainer(args: Any, out: Out) -> None:
    """Each ZeRO stage in its own process: a Trainer owns the process group, and a fresh process
    frees everything (GPU memory included) between stages."""
    if args.trainer_child is not None:
        trainer_child(args, out)
        return
    for stage in (int(s) for s in args.zero.split(",")):
        left = args.deadline - time.monotonic()
        if left < 30:
            out.emit("trainer", zero=stage, skipped="time limit reached before it started")
            continue
        cmd = [sys.executable, str(SCRIPT), "--only", "trainer", "--trainer-child", str(stage)]
        cmd += ["--device", args.device, "--out", str(args.out), "--time-limit-s", str(int(left - 10))]
        cmd += [
            "--size",
            "x".join(map(str, args.size)),
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
        ]
        cmd += ["--trainer-batch", str(args.trainer_batch), "--trainer-layout", args.trainer_layout]
        cmd += ["--workers", str(_workers(args))] + (["--trainer-compile"] if args.trainer_compile else [])
        cmd += ["--compile-mode", args.compile_mode]
        cmd += [] if args.bf16 else ["--no-bf16"]
        env = {**os.environ, "DS_ACCELERATOR": "cuda" if args.device == "cuda" else "cpu"}
        try:
            r = subprocess.run(cmd, env=env, timeout=left - 5)
        except subprocess.TimeoutExpired:
            out.emit("trainer", zero=stage, stopped="time limit: the child process was stopped")
            continue
        if r.returncode:
            out.emit("trainer", zero=stage, error=f"child exited {r.returncode} (its lines above)")


def _workers(args: Any) -> int:
    if args.workers is not None:
        return args.workers
    return 0 if args.tiny else max(1, (os.cpu_count() or 2) - 1)


def trainer_child(args: Any, out: Out) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _trainer_run import SyncCounter, build_trainer, write_run

    stage, (frames, h, w), batch = args.trainer_child, args.size, args.trainer_batch
    accum = 2 if stage == 1 else 1  # the planner picks ZeRO-1 when accumulating
    mode = "compile" if args.trainer_compile else "eager"
    bare = cell_or_error(measure_bare, args.trainer_layout, mode, batch, args.size, args)
    steps, sync_steps = args.steps, max(2, min(5, args.steps))
    with tempfile.TemporaryDirectory() as tmp:
        extra = {
            "topology": {"device": args.device},
            "data": {"num_workers": min(_workers(args), 8), "max_delta": 1, "val_fraction": 0.0},
            "optim": {"batch_per_gpu": batch},
            "model": {
                "channels_last": args.trainer_layout == "channels_last",
                "compile": args.trainer_compile,
                "compile_mode": args.compile_mode,
            },
        }
        t0 = time.perf_counter()
        total = steps + sync_steps + args.warmup
        run = write_run(
            Path(tmp), stage, accum, total, frames, h, w, clips=4, extra=extra, source_frames=frames + 4
        )
        trainer = build_trainer(run)
        build_s = time.perf_counter() - t0
        waits: list[float] = []
        nxt = trainer.batches.next

        def timed_next() -> dict:
            t = time.perf_counter()
            try:
                return nxt()
            finally:
                waits.append(time.perf_counter() - t)

        trainer.batches.next = timed_next  # type: ignore[method-assign]
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            trainer.train_step()
        sync(args.device)
        warm_s = time.perf_counter() - t0
        free(args.device)
        waits.clear()
        marks = Marks(args.device)
        for _ in range(steps):
            marks.start()
            trainer.train_step()
            marks.mark()
        step_ms = [r[0] for r in marks.ms()]
        row = throughput(batch * accum, step_ms, marks.span_ms(), flop_per_clip_step(frames, h, w), args)
        if args.trainer_compile:
            # ZeRO-1/2 compile each of the 9 stages whole; ZeRO-3's gather hooks on every module
            # break them (on CPU: 30 breaks, 59 graphs, the hooks run eagerly), which these say on the GPU
            from torch._dynamo.utils import counters

            row["graph_breaks"] = sum(counters["graph_break"].values())
            row["graphs"] = counters["stats"]["unique_graphs"]
        side_stream = trainer.batches.prefetcher.side_stream
        out.emit(
            "trainer",
            zero=stage,
            grad_accum=accum,
            batch=batch,
            layout=args.trainer_layout,
            mode=mode,
            clip=f"{frames}x{h}x{w}",
            precision=trainer.rt.precision,
            **row,
            data_wait_ms=round(1e3 * sum(waits) / max(1, steps), 3),
            **memory(args.device),
            build_s=round(build_s, 2),
            warmup_s=round(warm_s, 2),
            # the peak the trainer's own `mfu` (its step events) divides by: None on CPU
            trainer_peak_tflops=trainer.reporter.peak_tflops,
            bare_clips_per_s=bare.get("clips_per_s"),
            ratio_to_bare=round(row["clips_per_s"] / bare["clips_per_s"], 3)
            if bare.get("clips_per_s")
            else None,
            prefetch="CUDA side stream, one batch ahead (trainer/prefetch.py)"
            if side_stream
            else "batch by batch (no CUDA)",
            loader_workers=trainer.cfg.data.num_workers,
            jitter=trainer.cfg.data.color_jitter,
        )
        counter = SyncCounter()
        counter.track_phases(trainer)
        counter.install()
        counter.active = True
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if args.device == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
            try:
                for _ in range(sync_steps):
                    trainer.train_step()
            finally:
                if args.device == "cuda":
                    torch.cuda.set_sync_debug_mode(0)
                counter.active = False
                counter.uninstall()
        cuda_syncs = collections.Counter(
            f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)
        )
        out.emit(
            "trainer",
            zero=stage,
            what="host syncs per optimizer step",
            steps=sync_steps,
            **counter.totals(sync_steps),
            hooked_sites={
                f"{o} {p} {s}": round(n, 3) for (p, o, s), n in sorted(counter.per_step(sync_steps).items())
            },
            cuda_sync_debug_per_step=round(sum(cuda_syncs.values()) / sync_steps, 3)
            if args.device == "cuda"
            else "no CUDA",
            cuda_sync_sites={k: round(n / sync_steps, 3) for k, n in cuda_syncs.most_common(12)},
        )
        # one real train_step profiled: where its time goes beyond the bare loop's (DeepSpeed's
        # kernels and host work, the loader hand-off, the jitter), and how long the device idles
        from torch.profiler import profile

        with profile(activities=_activities(args.device)) as prof:
            trainer.train_step()
            sync(args.device)
        summary = profile_summary(prof, args.device, args.out / f"profile_trainer_zero{stage}.json")
        out.emit("trainer", zero=stage, what="profiled step", batch=batch, mode=mode, **summary)
        trainer.rt.leave(trainer.learner.engine)


# ---------------------------------------------------------------- profile
def _activities(device: str) -> list:
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])


def profile_summary(prof: Any, device: str, trace: Path) -> dict[str, Any]:
    """One profiled step: its kernels by kind, the share of the step with no kernel running, the top
    kernels, and the host's top operators by their own CPU time (what the host does while the device
    may wait); the Chrome trace is written to `trace`."""
    from torch.autograd import DeviceType

    prof.export_chrome_trace(str(trace))
    events = list(prof.events())
    if device == "cuda":
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        what = "CUDA kernels and copies"
    else:
        kernels = [e for e in events if e.device_type == DeviceType.CPU and not e.cpu_children]
        what = "CPU leaf operators, standing in for kernels (a convolution shows as its parts)"
    if not kernels:
        return {"error": "the profiler recorded no kernels (CUPTI unavailable?)", "trace": str(trace)}
    spans = sorted((e.time_range.start, e.time_range.end) for e in kernels)
    start = min(e.time_range.start for e in events)
    end = max(e.time_range.end for e in kernels)
    span = max(1e-9, end - start)
    by_kind: collections.Counter[str] = collections.Counter()
    by_name: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for e in kernels:
        d = e.time_range.end - e.time_range.start
        by_kind[kernel_kind(e.name)] += d
        by_name[e.name][0] += d
        by_name[e.name][1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:15]
    host = sorted(prof.key_averages(), key=lambda a: -a.self_cpu_time_total)[:10]
    return {
        "step_ms": round(span / 1e3, 3),
        "kernels": len(kernels),
        "kernels_are": what,
        "shares": {k: round(v / span, 4) for k, v in by_kind.most_common()},
        "idle_share": round(1 - busy_time(spans) / span, 4),
        "top_kernels": [
            {"name": n[:140], "kind": kernel_kind(n), "ms": round(t / 1e3, 3), "calls": c}
            for n, (t, c) in top
        ],
        "host_top": [
            {"name": a.key[:100], "self_cpu_ms": round(a.self_cpu_time_total / 1e3, 3), "calls": a.count}
            for a in host
        ],
        "trace": str(trace),
    }


def section_profile(args: Any, out: Out) -> None:
    from torch.profiler import profile

    layout, mode, batch = args.profile_layout, args.profile_mode, args.profile_batch
    if args.device != "cuda" and mode == "compile":
        out.emit("profile", skipped="compile: no CUDA")
        return
    model, opt = build_bare(layout, mode == "compile", args.device, args.compile_mode)
    video = clip_batch(batch, args.size[0], args.size[1], args.size[2], args.device)
    for _ in range(max(2, args.warmup)):
        bare_step(model, opt, video, args)
    sync(args.device)
    with profile(activities=_activities(args.device)) as prof:
        bare_step(model, opt, video, args)
        sync(args.device)
    trace = args.out / f"profile_{layout}_{mode}_b{batch}.json"
    summary = profile_summary(prof, args.device, trace)
    if "error" in summary:
        out.emit("profile", **summary)
    else:
        out.emit(
            "profile", layout=layout, mode=mode, batch=batch, clip="x".join(map(str, args.size)), **summary
        )
    del model, opt, video, prof
    free(args.device)


# ---------------------------------------------------------------- input
def _teacher(args: Any) -> tuple[torch.nn.Module, str]:
    from diffusers import AutoencoderKLHunyuanVideo

    if args.teacher:
        from trainer.teacher import load_teacher

        vae, label = load_teacher(args.teacher), f"teacher from {args.teacher}"
    elif args.tiny or args.device != "cuda":
        vae = AutoencoderKLHunyuanVideo(
            block_out_channels=(8, 8, 16, 16),
            layers_per_block=1,
            norm_num_groups=4,
            mid_block_add_attention=False,
        )
        label = "TINY random AutoencoderKLHunyuanVideo: not a teacher's cost"
    else:
        vae = AutoencoderKLHunyuanVideo()
        label = "HunyuanVideo VAE architecture, random weights (a real teacher's cost; no teacher given)"
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    return vae.requires_grad_(False).eval().to(args.device, dtype), label


def section_input(args: Any, out: Out) -> None:
    from trainer.augment import to_model_input
    from trainer.teacher import encode

    frames, h, w = args.size
    batch = args.trainer_batch
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    clip = "x".join(map(str, args.size))
    if args.device == "cuda":
        host = clip_batch(batch, frames, h, w, "cpu", pin=True)
        for pinned, src in (("pinned", host), ("pageable", host.clone())):
            ms = _timed_ms(functools.partial(src.to, "cuda", non_blocking=True), "cuda", 10)
            out.emit(
                "input",
                what="H2D uint8 batch",
                memory=pinned,
                batch=batch,
                clip=clip,
                ms=ms,
                gb_s=round(host.numel() / ms / 1e6, 2),
            )
    else:
        out.emit("input", what="H2D uint8 batch", skipped="no CUDA")
    video = clip_batch(batch, frames, h, w, args.device)
    factors = torch.tensor([[1.05, 0.95, 1.02]] * batch, device=args.device)
    variants: list[tuple[str, Callable[..., torch.Tensor]]] = [("eager", to_model_input)]
    if args.device == "cuda":  # as trainer.batches does under model.compile
        variants.append(("compile", torch.compile(to_model_input, dynamic=False)))
    for name, fn in variants:
        ms = _timed_ms(functools.partial(fn, video, dtype, factors), args.device, 10)
        out.emit(
            "input",
            what="jitter: trainer.augment.to_model_input",
            mode=name,
            batch=batch,
            clip=clip,
            ms=ms,
            ms_per_clip=round(ms / batch, 3),
        )
    try:
        vae, label = _teacher(args)
    except ImportError as err:
        out.emit("input", what="teacher encode", skipped=f"diffusers unavailable ({err})")
    else:
        x = video[:1].float().div(255)
        with torch.no_grad():
            ms = _timed_ms(functools.partial(encode, vae, x), args.device, 2 if args.tiny else 3)
        out.emit("input", what="teacher encode per clip", teacher=label, clip=clip, ms=ms)
        del vae
        free(args.device)
    try:
        _loader(args, out)
    except ImportError as err:  # the trainer's data path needs PyAV and pydantic
        out.emit("input", what="loader", skipped=f"{err}")


def _loader(args: Any, out: Out) -> None:
    from trainer.bench_data import measure_loader
    from trainer.config import DataSection
    from trainer.data import VideoClipDataset, find_videos, make_train_loader
    from trainer.synthetic import make_synthetic

    frames, h, w = args.size
    workers = _workers(args)
    with tempfile.TemporaryDirectory() as tmp:
        source = str(args.data) if args.data else tmp
        if not args.data:
            make_synthetic(Path(tmp), clips=4, frames=frames + 4, height=h, width=w, seed=0)
        cfg = DataSection(source=source, frames=frames, height=h, width=w, num_workers=workers, max_delta=1)
        paths = find_videos(cfg.source)
        cost = measure_loader(paths, cfg, clips=2 if args.tiny else 8)
        batches = 2 if args.tiny else 10
        loader = make_train_loader(
            VideoClipDataset(paths, cfg, train=True),
            0,
            1,
            0,
            args.trainer_batch,
            0,
            workers,
            cfg.prefetch_factor,
        )
        it = iter(loader)
        next(it)  # workers start
        t0 = time.perf_counter()
        for _ in range(batches):
            next(it)
        rate = batches * args.trainer_batch / (time.perf_counter() - t0)
        del it, loader
    out.emit(
        "input",
        what="loader",
        source=source if args.data else "synthetic clips (make_synthetic)",
        clip=f"{frames}x{h}x{w}",
        **{k: v for k, v in cost.to_dict().items() if k.endswith("_s")},
        workers=workers,
        clips_per_s_at_workers_estimate=round(workers * cost.clips_per_s_per_worker, 2) if workers else None,
        clips_per_s_measured=round(rate, 2),
    )


def section_crop(args: Any, out: Out) -> None:
    """The author's recipe (12x64x64 crops) at batch 64 and 256, in the first of --layouts only."""
    size, batches = (CROP_TINY, (2, 4)) if args.tiny else (CROP, (64, 256))
    layout = args.layouts[0]
    for mode in [m for m in ("eager", "compile") if m in args.modes]:
        for batch in batches:
            if mode == "compile" and args.device != "cuda":
                out.emit("crop", mode=mode, batch=batch, skipped="compile: no CUDA")
                continue
            cell = cell_or_error(measure_bare, layout, mode, batch, size, args)
            out.emit("crop", layout=layout, mode=mode, batch=batch, **cell)


SECTION_RUNNERS = {
    "trainer": section_trainer,
    "profile": section_profile,
    "input": section_input,
    "crop": section_crop,
}
