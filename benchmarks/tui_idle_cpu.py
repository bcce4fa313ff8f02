"""CPU used by the console's own process while it shows the dashboard of a 64-node run (8 GPUs
each, the fixed sample state of the UI tests) in a real terminal (a pty, 160x50):
- idle: the state does not change (nothing to redraw);
- live: a new state every 0.5 s, the monitor's fastest publish rate, each with every node's
  numbers changed (the worst case: all 64 cells and the panes redraw).
The monitor's own threads (pollers, agents) are not part of this figure: see
benchmarks/watch_monitor_cost.py.

    .venv/bin/python benchmarks/tui_idle_cpu.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NODES = 64


def child(seconds: float, interval: float | None) -> None:
    """The console on this terminal, showing the sample; exits after `seconds` of measurement."""
    sys.path.insert(0, str(ROOT))
    from taehv_console.core.flow.options import FlowOptions
    from taehv_console.ui.app import make_app
    from taehv_console.ui.config import ConsoleConfig
    from taehv_console.ui.messages import ClusterUpdated
    from taehv_console.ui.screens.dashboard import DashboardScreen
    from tests.ui import samples

    base = samples.cluster_state(NODES, trouble=True)
    app = make_app(FlowOptions(runs="/nonexistent"), startup="none", config=ConsoleConfig())

    def varied(i: int):
        # every node's sample and the header change, as on a busy cluster
        nodes = tuple(
            dataclasses.replace(
                n,
                sample_age_s=0.1 * (i % 7),
                sample=dataclasses.replace(
                    n.sample, cpu_pct=10 + (i * 7 + k) % 50, gpus=samples._gpus(k, 0.9 + 0.1 * ((i + k) % 2))
                ),
            )
            for k, n in enumerate(base.nodes)
        )
        run = dataclasses.replace(base.run, step=base.run.step + i)
        return dataclasses.replace(
            base, time=base.time + interval * i, seq=base.seq + i, nodes=nodes, run=run
        )

    async def pilot(p) -> None:
        app.cluster_state = base
        await app.push_screen(DashboardScreen())
        await p.pause(2.0)
        os.write(1, b"\x1b]0;MEASURE\x07")  # tell the parent: from here on (Textual captures print)
        if interval:
            states = [varied(i) for i in range(40)]
            end = time.monotonic() + seconds
            i = 0
            while time.monotonic() < end:
                app.post_message(ClusterUpdated(states[i % len(states)]))
                i += 1
                await asyncio.sleep(interval)
        else:
            await asyncio.sleep(seconds)
        os.write(1, b"\x1b]0;DONE\x07")
        await asyncio.sleep(0.5)
        app.exit()

    app.run(auto_pilot=pilot)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(seconds: float, interval: float | None) -> float:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    argv = [sys.executable, __file__, "--child", "--seconds", str(seconds)]
    if interval:
        argv += ["--interval", str(interval)]
    proc = subprocess.Popen(
        argv,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=ROOT,
        start_new_session=True,
        env={**os.environ, "TERM": "xterm-256color"},
        close_fds=True,
    )
    os.close(slave)
    buf = b""
    start_cpu = start_t = None
    result = float("nan")
    try:
        while proc.poll() is None:
            if select.select([master], [], [], 0.05)[0]:
                try:
                    data = os.read(master, 1 << 16)
                except OSError:
                    break
                buf = (buf + data)[-4096:]
                if start_cpu is None and b"MEASURE" in buf:
                    start_cpu, start_t = cpu_seconds(proc.pid), time.monotonic()
                if start_cpu is not None and b"DONE" in buf:
                    result = 100 * (cpu_seconds(proc.pid) - start_cpu) / (time.monotonic() - start_t)
                    buf = b""
                    start_cpu = float("inf")
    finally:
        if proc.poll() is None:
            proc.kill()  # the console this benchmark started, by its own pid
        proc.wait()
        os.close(master)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--interval", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.seconds, args.interval)
        return 0
    idle = measure(args.seconds, None)
    live = measure(args.seconds, 0.5)
    print(
        f"console process CPU on the {NODES}-node dashboard (160x50 pty, {args.seconds:g} s each, "
        f"{os.cpu_count()} CPUs; 100% = one core)"
    )
    print(f"  idle (no new state)          {idle:5.1f} %")
    print(f"  live (new state every 0.5 s) {live:5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
