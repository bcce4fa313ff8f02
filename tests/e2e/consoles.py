"""Helpers for end-to-end tests: `taehv-console` as the user runs it (a separate process, JSON
output read line by line), and what the tests check on the nodes afterwards (over SSH, by the
recorded process groups, as the console itself does)."""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# What a console-driven run in these tests adds to its preset: one thread per rank (THREADS: the
# ranks, and the "nodes", share the machine's cores), 32x32 crops of the clips and one micro-batch
# per step. A cpu-smoke step (2 micro-batches of 8x64x64) costs ~2.7 s on a 2-core CI machine,
# ~1.4 s at 32x32, and about half that with one micro-batch; these runs prove the console's control
# of a run (launch, stop, recovery, node loss), not what the model learns, which test_headless.py
# and tests/trainer/test_smoke_learns.py check with the preset as shipped; so no validation of the
# untrained model before step 1 either (cpu-smoke's val_at_start: samples, TensorBoard images).
# Accumulation itself is the trainer tests' (tests/trainer: the ZeRO-1/2/3 scenarios accumulate 2
# micro-batches), and a node lost keeps the effective batch by accumulating
# (tests/e2e/test_node_loss.py: 1 -> 2).
THREADS = ("--env", "OMP_NUM_THREADS=1")
SMALL_RUN = (
    *THREADS,
    *("--set", "data.height=32", "--set", "data.width=32", "--set", "optim.grad_accum=1"),
    *("--set", "schedule.val_at_start=false"),
)


def free_port() -> int:
    """A port free now, below Linux's ephemeral range (32768-60999): a port the kernel hands out
    for bind(0) can be handed again, between a run's attempts, to whatever listens next (a SLURM
    step's own sockets, a gloo pair), which took a run's rendezvous port once in CI."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port in 20000-32000")


class PortHolder:
    """Takes `port` on this machine as soon as it is free (the run's own listener gone) and holds
    it, accepting connections, until closed: another process holding a run's rendezvous port."""

    def __init__(self, port: int):
        self.port = port
        self.taken = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._hold, daemon=True)
        self._thread.start()

    def _hold(self) -> None:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            while not self._done.is_set():
                try:
                    srv.bind(("0.0.0.0", self.port))
                    srv.listen(64)
                    break
                except OSError:
                    time.sleep(0.02)
            else:
                return
            self.taken.set()
            self._done.wait()
        finally:
            srv.close()

    def close(self) -> None:
        self._done.set()
        self._thread.join(5)


def cli_argv(*args: Any) -> list[str]:
    return [sys.executable, "-m", "taehv_console.cli", *map(str, args)]


def run_cli(
    *args: Any, env: dict | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli_argv(*args), capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False
    )


class Console:
    """A `taehv-console ... --json` process in a session of its own (so a test can SIGKILL it like
    a closed terminal would end it), with its JSON lines collected by a reader thread."""

    def __init__(
        self,
        *args: Any,
        env: dict | None = None,
        cwd: Path | None = None,
        argv: list[str] | None = None,
        job_control: bool = False,
    ):
        # argv: the whole command line, when the console runs under another command (salloc ...).
        # job_control: a process group of its own inside this session, as a shell's job is, rather
        # than a session: a session leader's group is orphaned, and the kernel discards a SIGTSTP
        # whose default action would stop it (Ctrl-Z works only on a job).
        self.argv = argv or cli_argv(*args)
        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
            **({"process_group": 0} if job_control else {"start_new_session": True}),
        )
        self.lines: list[dict] = []
        self._q: queue.Queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.stderr = ""

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                obj = {"source": "raw", "text": line.rstrip()}
            obj.setdefault("_seen", time.time())
            self.lines.append(obj)
            self._q.put(obj)

    def wait_for(self, predicate, timeout: float, what: str) -> dict:
        """The first line (already seen or arriving) for which predicate(line) is true."""
        for obj in list(self.lines):
            if predicate(obj):
                return obj
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                obj = self._q.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None and self._q.empty():
                    self._reader.join(2)
                    if self._q.empty():
                        break
                continue
            if predicate(obj):
                return obj
        raise AssertionError(
            f"no line for {what} within {timeout} s (exit {self.proc.poll()}):\n{self.tail()}"
        )

    def wait(self, timeout: float) -> int:
        """The console's exit status. While the run it follows keeps stepping (step lines keep
        coming), it is slow, not stuck: the wait fails only after `timeout` seconds with neither an
        exit nor a new step line."""
        deadline = time.time() + timeout
        while True:
            try:
                rc = self.proc.wait(min(1.0, max(0.0, deadline - time.time())))
                break
            except subprocess.TimeoutExpired:
                last_step = max((o["_seen"] for o in list(self.lines) if is_step(o)), default=0.0)
                deadline = max(deadline, last_step + timeout)
                if time.time() >= deadline:
                    raise AssertionError(
                        f"{self.argv[3:]} did not end within {timeout} s of its last step:\n{self.tail()}"
                    ) from None
        self._reader.join(5)
        self.stderr = self.proc.stderr.read()
        return rc

    def result(self) -> dict:
        return next(obj for obj in reversed(self.lines) if obj.get("kind") == "result")

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        """The console dies without a word (a closed terminal, a lost SSH session to the head node)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def tail(self, n: int = 25) -> str:
        out = [json.dumps({k: v for k, v in obj.items() if k != "_seen"})[:400] for obj in self.lines[-n:]]
        return "\n".join(out)


def is_step(obj: dict, at_least: int = 1) -> bool:
    return (
        obj.get("source") == "trainer"
        and obj.get("kind") == "step"
        and obj.get("rank") == 0
        and obj.get("step", 0) >= at_least
    )


def events(run: Path, rank: int, kind: str | None = None) -> list[dict]:
    path = run / "events" / f"rank-{rank}.jsonl"
    if not path.exists():
        return []
    out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in out if kind is None or e["kind"] == kind]


def run_state(run: Path) -> dict:
    return json.loads((run / "state.json").read_text())


def tree_on(
    runner: Any, pgid: int, start_ticks: int | None = None, node: dict | None = None, run_id: str = ""
) -> list[int]:
    """Live pids of a launcher's tree on the runner's node, asked there (over SSH for a remote node).
    The node tool lists only a group it can prove the run's, so a recorded launcher is asked with
    what state.json holds of it (`node`: the attempt's node entry, and the run's id): without it
    every group reads as unproven and empty, and a check that nothing is left could not fail."""
    argv = [runner.python, "-m", "taehv_console.core.run.node", "pids", "--pgid", str(pgid)]
    if node is not None:
        start_ticks = node.get("start_ticks", start_ticks)
        if node.get("boot_id"):
            argv += ["--boot-id", node["boot_id"]]
        argv += ["--node", str(node["index"])]
    if run_id:
        argv += ["--run-id", run_id]
    if start_ticks is not None:
        argv += ["--start-ticks", str(start_ticks)]
    res = runner.run(argv, timeout=60)
    assert res.exit_status == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])["pids"]


def pid_alive_on(runner: Any, pid: int) -> bool:
    """Whether a process is alive (not a zombie) on the runner's node."""
    code = f"import sys; s = open('/proc/{pid}/stat').read(); sys.exit(0 if s.rsplit(')', 1)[1].split()[0] != 'Z' else 1)"
    return runner.run([runner.python, "-c", code], timeout=60).exit_status == 0
