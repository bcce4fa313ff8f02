"""Start-up of `taehv-console` in a real terminal (a pty, 160x50): seconds from exec to the first
frame (the start screen), and to the wizard's first screen (no live run under --runs, so it opens
Detect). Python's imports are included: this is what a user waits for.

    .venv/bin/python benchmarks/tui_startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import select
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKS = {"first frame": b"looking for a live run", "wizard (Detect)": b"Detect"}


def one_start(runs_dir: str, timeout: float = 60.0) -> dict[str, float]:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    env = {
        **os.environ,
        "TERM": "xterm-256color",
        "PYTHONPATH": str(ROOT),
        "XDG_CONFIG_HOME": tempfile.mkdtemp(prefix="taehv-bench-config-"),
    }
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "taehv_console.cli", "--runs", runs_dir],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=ROOT,
        start_new_session=True,
        close_fds=True,
    )
    os.close(slave)
    seen: dict[str, float] = {}
    buf = b""
    try:
        while len(seen) < len(MARKS) and time.perf_counter() - t0 < timeout:
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    buf += os.read(master, 1 << 16)
                except OSError:
                    break
                for name, mark in MARKS.items():
                    if name not in seen and mark in buf:
                        seen[name] = time.perf_counter() - t0
        os.write(master, b"q")
        end = time.perf_counter() + 10
        while proc.poll() is None and time.perf_counter() < end:
            if select.select([master], [], [], 0.05)[0]:
                try:
                    os.read(master, 1 << 16)
                except OSError:
                    break
    finally:
        if proc.poll() is None:
            proc.kill()  # the console this benchmark started, by its own pid
        proc.wait()
        os.close(master)
    return seen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="starts to time (default 5)")
    args = parser.parse_args()
    results: dict[str, list[float]] = {k: [] for k in MARKS}
    with tempfile.TemporaryDirectory(prefix="taehv-bench-runs-") as runs:
        one_start(runs)  # warm the file cache (imports), as every later start is
        for _ in range(args.runs):
            for name, seconds in one_start(runs).items():
                results[name].append(seconds)
    print(
        f"taehv-console start-up in a 160x50 pty, {args.runs} starts (after one warm-up), {os.cpu_count()} CPUs"
    )
    for name, values in results.items():
        if values:
            print(
                f"  exec -> {name:<16} median {statistics.median(values):.2f} s   min {min(values):.2f} s   "
                f"max {max(values):.2f} s"
            )
        else:
            print(f"  exec -> {name:<16} not seen")
    return 0


if __name__ == "__main__":
    sys.exit(main())
