"""Records the real outputs the forensics tests parse: py-spy dumps and errors, and PyTorch's Flight
Recorder analyser over dumps written by torch's own recorder. Run it again when py-spy or torch
changes: `.venv/bin/python tests/core/forensics/record_fixtures.py` (root, for the SYS_PTRACE case).

Flight Recorder: this machine has no NCCL, so the dumps come from torch's recorder on two gloo
ranks (TORCH_FR_BUFFER_SIZE, torch._C._distributed_c10d._dump_fr_trace), rank 0 having entered
collective 4 that rank 1 never joins. The gloo writer leaves `pg_config` keyed by an empty group
name, which the analyser cannot match (KeyError); the NCCL writer keys it by the group's name
("0" for the default group), so that one field is rewritten to the NCCL layout. Everything else,
entries, frames, states, version, is what torch wrote.
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent / "fixtures"
PY = sys.executable
PYSPY = str(Path(PY).parent / "py-spy")

# A rank stand-in: the main thread waits in wait_for_batch (a rank stuck in data loading), a
# loader thread spins beside it. "ready" comes from inside, so a stop right after it finds it there.
STUCK = """
import threading, time
def loader_worker():
    while True:
        time.sleep(0.1)
threading.Thread(target=loader_worker, name="loader-0", daemon=True).start()
def wait_for_batch():
    print("ready", flush=True)
    time.sleep(1000)
def train_step():
    wait_for_batch()
train_step()
"""

GLOO_RANK = """
import os, sys, time, torch, torch.distributed as dist
rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
if rank == 0:
    work = dist.all_reduce(t, async_op=True)  # collective 4: rank 1 never joins
    time.sleep(2)
open(os.path.join(out, f"trace_rank_{rank}"), "wb").write(torch._C._distributed_c10d._dump_fr_trace())
os._exit(0)
"""


def _start(code: str, *prefix: str) -> subprocess.Popen:
    p = subprocess.Popen([*prefix, PY, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def _pyspy(pid: int, *extra: str, wrap: tuple[str, ...] = ()) -> str:
    if wrap:
        cmd = [*wrap, f"{PYSPY} dump --pid {pid} {' '.join(extra)}"]
    else:
        cmd = [PYSPY, "dump", "--pid", str(pid), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    return res.stdout + res.stderr


def record_pyspy() -> None:
    p = _start(STUCK)
    try:
        time.sleep(0.5)  # in time.sleep, not on the print line
        (HERE / "pyspy_two_threads.txt").write_text(_pyspy(p.pid))
        os.kill(p.pid, 19)  # SIGSTOP
        (HERE / "pyspy_stopped_blocking.txt").write_text(_pyspy(p.pid))
        (HERE / "pyspy_stopped_nonblocking.txt").write_text(_pyspy(p.pid, "--nonblocking"))
        os.kill(p.pid, 18)
    finally:
        p.kill()
        p.wait()
    (HERE / "pyspy_gone.txt").write_text(_pyspy(p.pid))
    if os.geteuid() == 0 and shutil.which("capsh") and shutil.which("setpriv"):
        other = _start(STUCK, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
        try:
            out = _pyspy(other.pid, wrap=("capsh", "--drop=cap_sys_ptrace", "--", "-c"))
            (HERE / "pyspy_denied_no_sys_ptrace.txt").write_text(out)
        finally:
            other.kill()
            other.wait()


def record_flight_recorder() -> None:
    raw = Path(tempfile.mkdtemp(prefix="fr-raw-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "2000"}
    procs = [subprocess.Popen([PY, "-c", GLOO_RANK, str(r), port, str(raw)], env=env) for r in (0, 1)]
    for p in procs:
        p.wait(timeout=120)
    dumps = HERE / "fr_dumps"
    shutil.rmtree(dumps, ignore_errors=True)
    dumps.mkdir()
    for r in (0, 1):
        data = pickle.loads((raw / f"trace_rank_{r}").read_bytes())
        data["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
        (dumps / f"trace_rank_{r}").write_bytes(pickle.dumps(data))
    analyser = [PY, "-m", "torch.distributed.flight_recorder.fr_trace", "--prefix", "trace_rank_"]
    res = subprocess.run([*analyser, str(dumps)], capture_output=True, text=True, timeout=120)
    (HERE / "fr_analysis_missing_rank.txt").write_text(res.stdout + res.stderr)
    only0 = Path(tempfile.mkdtemp(prefix="fr-only0-"))
    shutil.copy(dumps / "trace_rank_0", only0)
    res = subprocess.run([*analyser, str(only0)], capture_output=True, text=True, timeout=120)
    (HERE / "fr_analysis_no_dump_strict.txt").write_text(res.stdout + res.stderr)
    res = subprocess.run(
        [*analyser, "--allow-incomplete-ranks", str(only0)], capture_output=True, text=True, timeout=120
    )
    (HERE / "fr_analysis_no_dump_incomplete.txt").write_text(res.stdout + res.stderr)
    shutil.rmtree(raw, ignore_errors=True)
    shutil.rmtree(only0, ignore_errors=True)


if __name__ == "__main__":
    HERE.mkdir(exist_ok=True)
    record_pyspy()
    record_flight_recorder()
    print("recorded into", HERE)
