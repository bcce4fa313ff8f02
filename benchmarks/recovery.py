"""What a failure costs with the console's recovery: for each fault, on the real trainer (cpu-smoke:
2 DeepSpeed ranks on gloo, generated clips), the seconds from the fault to training again, split
into detection, teardown and relaunch, and the steps trained again since the checkpoint resumed.

    .venv/bin/python benchmarks/recovery.py [--faults kill9,kill9-unwatched,sigstop,error,node-lost,
        node-lost-spare] [--stall-after 20] [--keep]

kill9: SIGKILL of rank 1 (the OOM killer, a crash); kill9-unwatched: the console SIGKILLed first (a
closed terminal), then rank 1: the run's supervisor alone heals it (the other faults run with
TAEHV_SUPERVISOR=off, the console controlling the run; the recovery is the same code); sigstop: rank 1 stops and never comes back (a
hang; ended at recovery.stall_restart_after_s); error: the trainer raises an error that would
repeat (ended at once, no restart: the figure is the time to FAILED); node-lost: two loopback
"nodes" over a real sshd (one rank each, as tests/e2e/test_node_loss.py), and node 1's sshd and
every process on it SIGKILLed, so it cannot be reached: it is left out and the run goes on with one
node through a universal checkpoint; node-lost-spare: the same with a spares hostfile, so a spare
takes its place at the same world size (needs openssh-server). One JSON line per fault:
fault_to_training_s from the signal itself; lost_s from the failed attempt's last step, split into
detect_s (to the failure named), teardown_s (to nothing of it left) and relaunch_s (backoff,
start-up and checkpoint load, to the first step again).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from taehv_console.core.run.outcome import settled
from taehv_console.core.run.recovery import recoveries
from taehv_console.core.run.state import RunState

FAULTS = ("kill9", "kill9-unwatched", "sigstop", "error", "node-lost", "node-lost-spare")
# how long the supervisor gets to carry an unwatched run to its end
UNWATCHED_S = 900.0
NODE0, LOST, SPARE = "127.0.0.2", "127.0.0.6", "127.0.0.4"
SSH_KEYS = ("client_ed25519", "client_ed25519.pub", "ssh_host_ed25519_key", "ssh_host_ed25519_key.pub")


class TwoNodes:
    """Two loopback nodes: NODE0 and SPARE behind one sshd, LOST behind an sshd of its own on the
    same port and keys, so that losing it (its sshd and every process on it killed) leaves nothing
    that answers there."""

    def __init__(self, work: Path, spare: bool):
        from tests.conftest import LoopbackSshd

        self.work, self.spare = work, spare
        self.main = LoopbackSshd(work / "sshd", n_hosts=3, first=2).start()
        own = work / "node-sshd"
        own.mkdir()
        for name in SSH_KEYS:
            shutil.copy(self.main.dir / name, own / name)
        self.node = LoopbackSshd(own, n_hosts=1, first=6).start(port=self.main.port)
        self.known = work / "known_hosts"
        self.known.write_text(
            Path(self.main.known_hosts).read_text() + Path(self.node.known_hosts).read_text()
        )
        self.lost_pids: list[int] = []

    def args(self) -> list[str]:
        hostfile = self.work / "hostfile"
        hostfile.write_text(f"{NODE0} slots=1\n{LOST} slots=1\n")
        with socket.socket() as s:
            s.bind((NODE0, 0))
            port = s.getsockname()[1]
        out = ["--hosts", str(hostfile), "--master-port", str(port)]
        if self.spare:
            (self.work / "spares").write_text(f"{SPARE} slots=1\n")
            out += ["--spares", str(self.work / "spares")]
        return out

    def env(self) -> dict[str, str]:
        return {**self.main.env(), "TAEHV_KNOWN_HOSTS": str(self.known)}

    def lose(self, run: Path) -> None:
        from tests.conftest import process_tree

        node1 = next(
            n
            for n in json.loads((run / "state.json").read_text())["attempts"][-1]["nodes"]
            if n["index"] == 1
        )
        sshd = self.node._proc
        pids = (process_tree(sshd.pid) if sshd is not None else []) + process_tree(node1["pid"])
        self.lost_pids = pids
        _kill(pids)

    def close(self) -> None:
        _kill(self.lost_pids)
        self.node.stop()
        self.main.stop()


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def console(
    runs: Path, *extra: str, env: dict[str, str] | None = None, supervised: bool = False
) -> subprocess.Popen:
    supervisor = "on" if supervised else "off"
    env = {**os.environ, **(env or {}), "TAEHV_SUPERVISOR": supervisor, "DS_ACCELERATOR": "cpu"}
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_NODELIST"):
        env.pop(key, None)
    argv = [sys.executable, "-m", "taehv_console.cli", "--no-tui", "--runs", str(runs), "--json"]
    argv += ["--set", "optim.max_steps=16", "--set", "schedule.checkpoint_every=5"]
    argv += ["--set", "schedule.val_every=1000", "--set", "recovery.backoff_s=1"]
    argv += ["--env", "OMP_NUM_THREADS=1", *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=runs.parent, env=env)


def wait_step(proc: subprocess.Popen, step: int) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if obj.get("kind") == "step" and obj.get("rank") == 0 and obj.get("step", 0) >= step:
            return
    raise SystemExit("the run ended before the fault could be injected")


def measure(fault: str, stall_after: float, keep: bool) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"taehv-recovery-{fault}-"))
    nodes = TwoNodes(work, spare=fault == "node-lost-spare") if fault.startswith("node-lost") else None
    try:
        out = _measure(fault, stall_after, work / "runs", nodes)
    finally:
        if nodes is not None:
            nodes.close()
        if not keep:  # a run directory holds ~0.7 GB of checkpoints
            shutil.rmtree(work, ignore_errors=True)
    if keep:
        out["runs"] = str(work / "runs")
    return out


def _measure(fault: str, stall_after: float, runs: Path, nodes: TwoNodes | None) -> dict:
    extra = ["--set", f"recovery.stall_restart_after_s={stall_after:g}"]
    if fault == "error":
        extra += ["--env", "TAEHV_FAULTS=raise:1:8"]
    unwatched = fault == "kill9-unwatched"
    proc = console(
        runs,
        *extra,
        *(nodes.args() if nodes else []),
        env=nodes.env() if nodes else None,
        supervised=unwatched,
    )
    wait_step(proc, 7)
    run = next(runs.glob("20*"))
    pid = json.loads((run / "heartbeat" / "rank-1.json").read_text())["pid"]
    if unwatched:
        proc.kill()  # the terminal closes
        proc.wait()
    t_fault = time.time()
    if nodes is not None:
        nodes.lose(run)
    elif fault in ("kill9", "kill9-unwatched"):
        os.kill(pid, signal.SIGKILL)
    elif fault == "sigstop":
        os.kill(pid, signal.SIGSTOP)
    rc: int | None = None
    if unwatched:
        _wait_settled(run)
    else:
        assert proc.stdout is not None
        proc.stdout.read()
        rc = proc.wait()
    state = json.loads((run / "state.json").read_text())
    attempts = state["attempts"]
    first = attempts[0]
    out = {"fault": fault, "exit_code": rc, "phase": state["phase"], "attempts": len(attempts)}
    out["cause"], out["decision"] = first.get("cause"), first.get("decision")
    detected = (state.get("failure") or {}).get("detected")
    if len(attempts) > 1:
        (r, *_) = recoveries(RunState.from_dict(state).attempts)
        out["fault_to_training_s"] = round(attempts[1]["trained_at"] - t_fault, 1)
        out.update(
            lost_s=r.lost_s,
            detect_s=r.detect_s,
            teardown_s=r.teardown_s,
            relaunch_s=r.relaunch_s,
            redone_steps=r.redone_steps,
        )
    else:
        out["fault_to_failed_s"] = round((first.get("ended") or detected or t_fault) - t_fault, 1)
    for left_out in state.get("exclusions") or []:
        out.setdefault("excluded", []).append(
            {k: left_out.get(k) for k in ("host", "replaced_by", "nodes_before", "nodes_after")}
        )
    return out


def _wait_settled(run: Path) -> None:
    """Until the run has ended for good, as its supervisor carries it with no console open."""
    deadline = time.time() + UNWATCHED_S
    while time.time() < deadline:
        try:
            if settled(RunState.from_dict(json.loads((run / "state.json").read_text()))):
                return
        except (OSError, json.JSONDecodeError):
            pass  # not there yet: read it again
        time.sleep(1.0)
    raise SystemExit(f"{run}: the supervisor did not end the run within {UNWATCHED_S:g} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--stall-after", type=float, default=20.0, help="recovery.stall_restart_after_s")
    parser.add_argument("--keep", action="store_true", help="keep each fault's run directory (~0.7 GB)")
    args = parser.parse_args()
    faults = [f.strip() for f in args.faults.split(",")]
    if unknown := sorted(set(faults) - set(FAULTS)):
        parser.error(f"--faults: unknown {', '.join(unknown)} (known: {', '.join(FAULTS)})")
    for fault in faults:
        print(json.dumps(measure(fault, args.stall_after, args.keep)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
