"""What the run's compile cache (trainer/compile_cache.py) saves: the first step of a compiled run on
a machine whose Inductor cache is empty (a new pod, a spare node, another allocation), from cold and
from the parts an earlier attempt left in RUN/compile-cache/, beside a machine that compiled the
model before (its own Inductor cache warm).

Each attempt is a fresh process running the real trainer (`Trainer.train()`, one rank, DeepSpeed
ZeRO-2, or ZeRO-3 with --zero 3; bf16 on a GPU; two steps and the closing validation) with its own
TORCHINDUCTOR_CACHE_DIR, and prints its `compile` event as one JSON line (also appended to
OUT/results.jsonl):

    cold              an empty Inductor cache and no run cache: everything compiles
    run-cache         an empty Inductor cache, and the parts the cold attempt wrote
    warm-machine      the cold attempt's Inductor cache, no run cache: a relaunch on the same machine

On CPU the parts hold Inductor's graphs but not the C++ they compile into, which each machine
builds again; on a GPU they also hold the Triton kernels, so `run-cache` should come close to
`warm-machine` there.

    .venv/bin/python benchmarks/compile_cache.py                       # CPU, 8x32x32 clips: ~2 min
    .venv/bin/python benchmarks/compile_cache.py --zero 3              # under ZeRO-3's module hooks
    python3 benchmarks/compile_cache.py --device cuda --out "$OUT"     # 12x480x720, batch 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # _trainer_run, imported where used: the parent process never builds a trainer
ATTEMPTS = ("cold", "run-cache", "warm-machine")


def child(run: Path) -> None:
    from _trainer_run import build_trainer

    build_trainer(run).train()


def attempt(work: Path, name: str, args: argparse.Namespace, cache_from: Path | None, inductor: Path) -> dict:
    from _trainer_run import write_run

    frames, h, w = args.size
    extra = {
        "topology": {"device": args.device},
        "optim": {"batch_per_gpu": args.batch, "max_steps": 2},
        "model": {
            "compile": True,
            "channels_last": args.layout == "channels_last",
            "compile_mode": args.mode,
        },
    }
    run = write_run(work / name, args.zero, 1, 1, frames, h, w, clips=2, extra=extra)
    if cache_from is not None:
        shutil.copytree(cache_from / "compile-cache", run / "compile-cache")
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(inductor),
        "DS_ACCELERATOR": "cuda" if args.device == "cuda" else "cpu",
        "PYTHONUNBUFFERED": "1",
    }
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, __file__, "--child", str(run)], env=env, timeout=args.timeout_s)
    wall = time.perf_counter() - t0
    compiled = [
        e
        for e in map(json.loads, (run / "events" / "rank-0.jsonl").read_text().splitlines())
        if e["kind"] == "compile"
    ]
    row: dict = {"attempt": name, "exit": r.returncode, "process_s": round(wall, 1)}
    if compiled:
        c = compiled[-1]["cache"]
        row.update(
            first_step_s=compiled[-1]["first_step_s"],
            **{
                k: c.get(k)
                for k in ("loaded", "hits", "misses", "aot_hits", "aot_bypasses", "saved", "error")
            },
        )
    return row


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--size", default=None, help="FxHxW (default: 12x480x720 on cuda, 8x32x32 on cpu)")
    p.add_argument("--batch", type=int, default=None, help="clips per step (default: 2 on cuda, 1 on cpu)")
    p.add_argument("--layout", choices=("nchw", "channels_last"), default="channels_last")
    p.add_argument("--mode", default="default", help="torch.compile mode, as model.compile_mode")
    p.add_argument(
        "--zero", type=int, choices=(2, 3), default=2, help="ZeRO stage (3: the 16/48/64-GPU presets' hooks)"
    )
    p.add_argument("--out", type=Path, default=None, help="also append each line to OUT/results.jsonl")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per attempt")
    p.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main() -> None:
    args = parse()
    if args.child is not None:
        child(args.child)
        return
    gpu = args.device == "cuda"
    args.size = tuple(int(v) for v in (args.size or ("12x480x720" if gpu else "8x32x32")).split("x"))
    args.batch = args.batch or (2 if gpu else 1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cold_inductor = work / "inductor-cold"
        for name in ATTEMPTS:
            row = attempt(
                work,
                name,
                args,
                cache_from=work / "cold" / "run" if name == "run-cache" else None,
                inductor=work / "inductor-fresh" if name == "run-cache" else cold_inductor,
            )
            row = {
                "section": "compile_cache",
                "device": args.device,
                "clip": "x".join(map(str, args.size)),
                "batch": args.batch,
                "zero": args.zero,
                **row,
            }
            line = json.dumps(row)
            print(line, flush=True)
            if args.out is not None:
                args.out.mkdir(parents=True, exist_ok=True)
                with open(args.out / "results.jsonl", "a") as f:
                    f.write(line + "\n")


if __name__ == "__main__":
    main()
