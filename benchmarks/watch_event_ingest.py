"""Event ingestion: lines per second from a 1M-line events file, on one core.

Writes a rank-0 events file the way the trainer does (compact JSON: a start event, step events,
validation/checkpoint events every 500 steps, a skipped clip now and then), then ingests it the
way the monitor does on attach: Tailer (by byte offset, in 8 MB reads) -> EventFold. Pinned to
one CPU. Also printed for comparison: json.loads of every line, the cost without the shortcut of
skipping step lines that cannot reach a bounded history.

    python benchmarks/watch_event_ingest.py [--lines 1000000] [--repeat 3] [--keep FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from taehv_console.core.watch.events import EventFold
from taehv_console.core.watch.tail import Tailer


def write_events(path: Path, n_lines: int, seed: int = 1) -> int:
    rng = random.Random(seed)
    t = 1_760_000_000.0
    lines = [
        json.dumps(
            {
                "v": 1,
                "time": t,
                "rank": 0,
                "kind": "start",
                "world_size": 512,
                "node": "gpu-node-1",
                "local_rank": 0,
                "preset": "64gpu-h100",
                "resumed_from": None,
                "max_steps": 100000,
                "step": 0,
            },
            separators=(",", ":"),
        )
    ]
    step = 0
    while len(lines) < n_lines:
        step += 1
        t += 1.02 + rng.random() * 0.05
        loss = 0.02 + 0.5 / (1 + step / 400) + rng.random() * 0.002
        lines.append(
            json.dumps(
                {
                    "v": 1,
                    "time": t,
                    "rank": 0,
                    "kind": "step",
                    "step": step,
                    "loss": loss,
                    "recon_loss": loss,
                    "psnr": 10 * __import__("math").log10(1 / loss),
                    "lr": 2e-4,
                    "grad_norm": 0.5 + rng.random(),
                    "samples_per_s": 250 + rng.random() * 5,
                    "step_time_s": 1.02,
                    "gpu_mem_gb": 61.3,
                    "nonfinite_skipped": 0,
                },
                separators=(",", ":"),
            )
        )
        if step % 500 == 0:
            lines.append(
                json.dumps(
                    {
                        "v": 1,
                        "time": t,
                        "rank": 0,
                        "kind": "val",
                        "step": step,
                        "psnr": 30.1,
                        "ssim": 0.9,
                        "n_clips": 64,
                    },
                    separators=(",", ":"),
                )
            )
            lines.append(
                json.dumps(
                    {
                        "v": 1,
                        "time": t,
                        "rank": 0,
                        "kind": "checkpoint",
                        "step": step,
                        "path": "x",
                        "status": "complete",
                        "seconds": 4.2,
                        "bytes": 190_000_000,
                    },
                    separators=(",", ":"),
                )
            )
        if step % 1777 == 0:
            lines.append(
                json.dumps(
                    {
                        "v": 1,
                        "time": t,
                        "rank": 0,
                        "kind": "data",
                        "step": step,
                        "path": f"/data/v/{step}.mp4",
                        "reason": "corrupt video",
                    },
                    separators=(",", ":"),
                )
            )
    lines = lines[:n_lines]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


def ingest(run: Path) -> tuple[float, float, EventFold]:
    fold = EventFold()
    tail = Tailer(run, append=["events/rank-*.jsonl"])
    w0, c0 = time.perf_counter(), time.process_time()
    while True:
        res = tail.poll()
        for lines in res.lines.values():
            fold.feed(0, lines)
        if not res.more:
            break
    return time.perf_counter() - w0, time.process_time() - c0, fold


def parse_all(path: Path) -> float:
    t0 = time.process_time()
    with open(path, "rb") as f:
        for line in f:
            json.loads(line)
    return time.process_time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", help="write the events file here (default: a temporary directory)")
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})  # one core
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(args.keep).parent.parent if args.keep else Path(tmp) / "run"
        path = Path(args.keep) if args.keep else run / "events" / "rank-0.jsonl"
        n = write_events(path, args.lines)
        size = path.stat().st_size
        path.read_bytes()  # warm the page cache: the figure is parsing, not the disk
        walls, cpus = [], []
        for _ in range(args.repeat):
            wall, cpu, fold = ingest(run)
            walls.append(wall)
            cpus.append(cpu)
            assert fold.lines == n and fold.last_step is not None
        full = parse_all(path)
        print(f"events file: {n:,} lines, {size / 1e6:.0f} MB (rank 0, one step line per step)")
        print(
            f"ingest (Tailer + EventFold, 1 core): median {statistics.median(walls):.3f} s wall, "
            f"{statistics.median(cpus):.3f} s CPU -> {n / statistics.median(walls):,.0f} lines/s"
        )
        print(
            f"  newest step {fold.last_step['step']}, {len(fold.loss)} history points, "
            f"{len(fold.checkpoints)} checkpoint events, {fold.data_skipped} skipped clips"
        )
        print(f"for comparison, json.loads of every line: {full:.3f} s CPU -> {n / full:,.0f} lines/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
