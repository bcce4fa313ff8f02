"""Records what the console's hang forensics read on real NCCL: torch's Flight Recorder dumps and the
analyser's verdict over them, for a collective that never completes.

    python3 benchmarks/nccl_forensics.py OUT [--timeout-s 20]

It needs CUDA and NCCL (a GPU machine; CI has neither, and the forensics tests replay what this
writes). With two GPUs, two ranks run and rank 1 never joins the 4th all-reduce. With one GPU, one
rank runs: NCCL refuses two ranks on one device (NCCL 2.28.9 on an H100: "Duplicate GPU detected :
rank 0 and rank 1 both on CUDA device"), so the rank's 4th all-reduce waits instead behind a kernel
that spins on the compute stream past the timeout. Either way the NCCL watchdog times the
collective out and dumps. What it writes under OUT:

- `fr/trace_rank_<r>`: the dumps written by the NCCL watchdog on the timeout
  (TORCH_NCCL_DUMP_ON_TIMEOUT, TORCH_FR_DUMP_TEMP_FILE);
- `fr/analysis.txt`: `python -m torch.distributed.flight_recorder.fr_trace` over them;
- `fr/rank_<r>.log`: each rank's stderr (NCCL_DEBUG=WARN), and `fr/summary.json`.

Each rank also runs the trainer's collective watch with its CUDA mark (`trainer.runtime.CudaMark`)
and marks each all-reduce as DeepSpeed's wrapped calls do; the host then blocks in a plain `.item()`
read, as in DeepSpeed's overflow check, which nothing marks. `summary.json`'s `heartbeats` holds
each rank's last heartbeat: the waiting rank's must say `waiting_op` all_reduce, 2 s or more after
its `waiting_since`; with two GPUs, rank 1 (which never joins) must not say it waits. While rank 0
waits, it is asked for its own stack dump (faulthandler on SIGUSR2, what forensics takes where
py-spy is refused): `self_dump` says whether it came and where the main thread stood.

Then NCCL's RAS service is asked about the job the way the console's forensics would
(`taehv_console.core.forensics.ras`): `ras` in `summary.json` holds the NCCL the rank has loaded,
whether the console's version policy lets it ask (and why), and where it does, RAS's reply
(`fr/ras.txt`) and its one-line verdict. With `--ras-anyway` it asks a version the policy refuses
too; the known bug of those versions can crash the rank before its Flight Recorder dump.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

RANK = """
import os, sys, time, datetime, pathlib, torch, torch.distributed as dist
rank = int(os.environ["RANK"])
torch.cuda.set_device(int(os.environ["DEVICE"]))
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=float(os.environ["TIMEOUT_S"])))
watch = beats = None
try:  # the trainer's collective watch, with its CUDA mark
    from trainer.events import CollectiveWatch, EventWriter, install_stack_dump
    from trainer.runtime import CudaMark
    install_stack_dump(pathlib.Path(os.environ["BEAT_DIR"]), rank)
    beats = EventWriter(pathlib.Path(os.environ["BEAT_DIR"]), rank)
    beats.heartbeat(0)
    watch = CollectiveWatch(beats, after_s=2.0, device=CudaMark())
except Exception as e:
    print(f"rank {rank}: no collective watch: {e!r}", file=sys.stderr, flush=True)
x = torch.ones(1 << 20, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
    if watch:
        watch.issued("all_reduce")
torch.cuda.synchronize()
if beats:
    beats.heartbeat(3, step_time_s=0.1)
print(f"rank {rank}: 3 all-reduces done", file=sys.stderr, flush=True)
if rank == 1:
    time.sleep(float(os.environ["TIMEOUT_S"]) * 4)  # never joins the 4th
else:
    if dist.get_world_size() == 1:  # the 4th waits behind a kernel spinning past the timeout
        torch.cuda._sleep(int(float(os.environ["TIMEOUT_S"]) * 4 * 2e9))
    dist.all_reduce(x)
    if watch:
        watch.issued("all_reduce")
    x[0].item()  # the host blocks in a read nothing marks; the watchdog aborts at the timeout
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _self_dump(proc: subprocess.Popen, fr: Path, deadline: float) -> dict:
    """Rank 0's own stack dump, 3 s into its wait in the 4th all-reduce."""
    from taehv_console.core.forensics import selfdump
    from trainer.events import stacks_path

    log = fr / "rank_0.log"
    while time.monotonic() < deadline and proc.poll() is None:
        if "3 all-reduces done" in log.read_text(errors="replace"):
            time.sleep(3)
            reply = selfdump.dump_by_signal(proc.pid, stacks_path(fr / "beats", 0))
            if reply["kind"] != selfdump.OK:
                return {"kind": reply["kind"], "error": reply["error"]}
            main = selfdump.parse_faulthandler(reply["text"], proc.pid, reply["main"]).main_thread()
            return {"kind": reply["kind"], "frames": list(main.frames[:4]) if main else []}
        time.sleep(0.2)
    return {"kind": "not asked", "error": "rank 0 never finished its first 3 all-reduces"}


def _ras(proc: subprocess.Popen, fr: Path, anyway: bool) -> dict:
    """NCCL RAS asked about the job while rank 0 waits, as the console's forensics asks it."""
    from taehv_console.core.forensics import ras

    if proc.poll() is not None:
        return {"kind": "not asked", "error": "rank 0 had already exited"}
    lib = ras.loaded_nccl(proc.pid)
    version = ras.nccl_version_of(lib) if lib else None
    allowed, why = ras.may_query(version)
    out: dict[str, object] = {
        "nccl_lib": lib,
        "version": ".".join(map(str, version)) if version else None,
        "console_asks": allowed,
        "policy": why,
    }
    if not lib:
        return {**out, "kind": "unavailable", "error": "rank 0 has no NCCL library mapped"}
    if not allowed and not anyway:
        return {**out, "kind": "not asked", "error": "the console's version policy refuses it (--ras-anyway)"}
    t0 = time.monotonic()
    reply = ras.query()
    (fr / "ras.txt").write_text(reply["text"])
    out.update(kind=reply["kind"], error=reply["error"], seconds=round(time.monotonic() - t0, 2))
    if reply["kind"] == "ok":
        out["verdict"] = ras.parse_status(reply["text"]).line()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--timeout-s", type=float, default=20.0)
    p.add_argument("--ras-anyway", action="store_true", help="ask RAS where the version policy would not")
    args = p.parse_args()
    import torch

    fr = args.out / "fr"
    fr.mkdir(parents=True, exist_ok=True)
    devices = torch.cuda.device_count()
    summary: dict[str, object] = {
        "torch": torch.__version__,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if devices else None,
        "devices": devices,
    }
    port = _free_port()
    world = 2 if devices > 1 else 1
    summary["world_size"] = world
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "DEVICE": str(rank),
            "BEAT_DIR": str(fr / "beats"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "TIMEOUT_S": str(args.timeout_s),
            "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TORCH_FR_DUMP_TEMP_FILE": str(fr / "trace_rank_"),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
            "NCCL_DEBUG": "WARN",
            "NCCL_RAS_ENABLE": "1",
        }
        log = open(fr / f"rank_{rank}.log", "w")
        procs.append((subprocess.Popen([sys.executable, "-c", RANK], env=env, stderr=log, stdout=log), log))
    start = time.monotonic()
    summary["self_dump"] = _self_dump(procs[0][0], fr, start + args.timeout_s * 2)
    summary["ras"] = _ras(procs[0][0], fr, args.ras_anyway)
    codes = []
    for proc, log in procs:
        try:
            codes.append(proc.wait(timeout=max(1.0, args.timeout_s * 3 - (time.monotonic() - start))))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
        log.close()
    summary["exit_codes"] = codes
    summary["wall_s"] = round(time.monotonic() - start, 1)
    summary["dumps"] = sorted(f.name for f in fr.glob("trace_rank_*"))
    summary["heartbeats"] = {
        f.stem: json.loads(f.read_text()) for f in sorted((fr / "beats" / "heartbeat").glob("rank-*.json"))
    }
    waiter, joiner = summary["heartbeats"].get("rank-0", {}), summary["heartbeats"].get("rank-1", {})
    summary["device_wait_told"] = (
        waiter.get("waiting_op") == "all_reduce"
        and waiter["time"] - waiter["waiting_since"] >= 2.0
        and "waiting_op" not in joiner
    )
    if summary["dumps"]:
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.flight_recorder.fr_trace",
                "--prefix",
                "trace_rank_",
                str(fr),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        (fr / "analysis.txt").write_text(r.stdout + r.stderr)
        summary["analysis_rc"] = r.returncode
    (fr / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
