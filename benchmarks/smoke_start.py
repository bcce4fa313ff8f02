"""Where a cpu-smoke run's start goes, from `taehv-console --no-tui` to the first step, as a user
runs it on this machine (generated clips, the local backend, 2 CPU ranks, DeepSpeed ZeRO-2, gloo).

Stages, as the run itself records them (state.json's attempt and node, each rank's `start` event
with its `startup` marks, the first `step` event), median over --repeat runs:
- console: `taehv-console` started -> the node's launcher spawned (imports, detect, preflight,
  plan, clips generated on the first run only, the run directory written)
- launcher: spawned -> the rank process created (the node wrapper, `accelerate launch`, torchrun)
- imports: rank created -> its imports done (torch, DeepSpeed, accelerate, the trainer)
- process_group: -> the gloo rendezvous of every rank
- engine: -> model built, DeepSpeed's engine made
- to_start: -> the `start` event (event files, TensorBoard, the first validation when
  val_at_start is on; off here)
- first_step: `start` -> the first step's event (a step of 2 micro-batches)
- total: `taehv-console` started -> first step

    python benchmarks/smoke_start.py [--repeat 3]

The same start is the first ~10 s of every DeepSpeed test in tests/trainer and tests/e2e.

Measured (2-core AMD EPYC, KVM; median of 4, seconds), before -> after the launcher ran accelerate's
launch module instead of its CLI wrapper and the ranks stopped building DeepSpeed's CPU shm_comm op:
console 3.64 -> 2.76, launcher 2.20 -> 0.88, imports 3.28 -> 2.72, process_group 0.25 -> 0.09,
engine 2.50 -> 2.04, first_step 1.78 -> 1.61; total 13.8 -> 10.2 s from `taehv-console` to the
first step. A machine's first CPU run also built the shm_comm op before: ~30 s more, ~50 CPU-s.
Then the ranks stopped importing transformers (accelerate's DeepSpeed plugin did, for
transformers' from_pretrained: trainer/runtime.py, DeepSpeedSettings), same machine, A/B minutes
apart, median of 4: engine 1.99 -> 1.38 and 1.48 (two medians), total 9.8 -> 8.6 and 9.4 s.
Then the ranks stopped importing torch._dynamo (torch.optim's AdamW did, on its first call, to keep
the compiler out of the optimizer: trainer/optim.py), same machine, A/B minutes apart, median of 4:
engine 1.24 -> 0.35, total 7.75 -> 6.59 s.
The same code on the same machine drifts with its host's load: 8.1, 9.5, 7.9 and 7.9 s at four
times of one day (2026-12-07). The last, median of 3, quiet machine: console 2.40, launcher 1.40,
imports 1.91, process_group 0.01, engine 0.40, first_step 1.67; total 7.88 s (7.51, 7.88, 8.02).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
STAGES = ("console", "launcher", "imports", "process_group", "engine", "to_start", "first_step", "total")


def first(path: Path, kind: str) -> dict:
    for line in path.read_text().splitlines():
        e = json.loads(line)
        if e.get("kind") == kind:
            return e
    raise SystemExit(f"{path}: no {kind} event")


def one_run(runs: Path, data: Path) -> dict[str, float]:
    env = {**os.environ, "TAEHV_SUPERVISOR": "off", "DS_ACCELERATOR": "cpu"}
    t0 = time.time()
    cmd = [str(BIN / "taehv-console"), "--no-tui", "--preset", "cpu-smoke", "--runs", str(runs)]
    cmd += ["--data", str(data), "--set", "optim.max_steps=2", "--set", "schedule.val_at_start=false"]
    cmd += ["--set", "schedule.val_every=1000", "--set", "schedule.checkpoint_every=1000"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"the run failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    run = max((p for p in runs.iterdir() if (p / "state.json").exists()), key=lambda p: p.stat().st_mtime)
    attempt = json.loads((run / "state.json").read_text())["attempts"][0]
    spawned = attempt["nodes"][0]["started"]
    start = first(run / "events" / "rank-0.jsonl", "start")
    step = first(run / "events" / "rank-0.jsonl", "step")
    marks = start["startup"]
    created = marks["created_at"]
    return {
        "console": spawned - t0,
        "launcher": created - spawned,
        "imports": marks["imports"],
        "process_group": marks["process_group"] - marks["imports"],
        "engine": marks["engine"] - marks["process_group"],
        "to_start": start["time"] - created - marks["engine"],
        "first_step": step["time"] - start["time"],
        "total": step["time"] - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "clips"
        made = subprocess.run(
            [
                str(BIN / "taehv-train"),
                "make-synthetic",
                str(data),
                "--clips",
                "12",
                "--frames",
                "8",
                "--size",
                "64x64",
            ],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            raise SystemExit(f"make-synthetic failed:\n{made.stderr}")
        rounds = []
        for i in range(args.repeat):
            r = one_run(Path(tmp) / f"runs{i}", data)
            rounds.append(r)
            print(json.dumps({"round": i + 1, **{k: round(v, 2) for k, v in r.items()}}))
        med = {k: round(statistics.median(r[k] for r in rounds), 2) for k in STAGES}
        print(json.dumps({"median_of": args.repeat, "cpus": os.cpu_count(), **med}))


if __name__ == "__main__":
    main()
