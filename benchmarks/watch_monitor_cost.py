"""Monitor cost: CPU of one core used by the monitor while it follows 64 nodes x 8 GPUs.

Starts 64 real agent processes in replay mode (a recorded 8 x H100 NVML reading, one sample each
at the monitor's agent interval: every second up to 128 nodes, nodes/128 s beyond; under
synthetic host names) and a writer process appending rank-0 step events at
10 per second, as the trainer writes them; optionally (--heartbeats) 512 heartbeat files replaced
every second as well. The monitor runs in this process with its default intervals; its CPU time
(all its threads) is measured over --seconds after a warm-up, and divided by the wall time. The
agents and the writer are separate processes and are not counted: they stand for the nodes.

    python benchmarks/watch_monitor_cost.py [--nodes 64] [--seconds 60] [--heartbeats] [--agents inproc]

--agents inproc replays one recorded agent line per node per agent interval from a thread of this process
instead of 256 agent processes (a small machine cannot host those and still measure the monitor);
the monitor parses the same lines either way, and the replay thread's CPU is measured and
subtracted. The figure that matters at scale: views published per second (>= 1) and the monitor's
share of one core (<= 10 %), with 2,048 heartbeat files replaced every second.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import threading

from taehv_console.core.watch.monitor import LocalLineStream, Monitor

RECORDED = ROOT / "tests" / "core" / "watch" / "fixtures" / "nvml" / "h100x8_training.json"

WRITER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from trainer.events import EventWriter, atomic_write_text
    run, ranks, rate = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    w = EventWriter(run, 0)
    w.emit("start", world_size=512, node="node-00", local_rank=0, preset="64gpu-h100", resumed_from=None,
           max_steps=1000000, step=0)
    step, next_beat = 0, 0.0
    t0 = time.monotonic()
    while True:
        step += 1
        w.emit("step", step=step, loss=0.05, recon_loss=0.05, psnr=13.0, lr=2e-4, grad_norm=0.7,
               samples_per_s=2560.0, step_time_s=0.1, gpu_mem_gb=61.3, nonfinite_skipped=0)
        now = time.monotonic()
        if ranks and now >= next_beat:  # every rank's heartbeat, once a second
            for r in range(ranks):
                atomic_write_text(run / "heartbeat" / f"rank-{r}.json", json.dumps(
                    {"step": step, "time": time.time(), "pid": os.getpid(), "host": f"node-{r // 8:02d}",
                     "step_time_s": 0.1, "wait_s": 0.01}))
            next_beat = now + 1.0
        time.sleep(max(0.0, t0 + step / rate - time.monotonic()))
""")


class _Replay:
    """One recorded agent sample line per node per second, written into per-node buffers by one
    thread (its CPU time is measured, to be subtracted from the monitor's)."""

    def __init__(self, run: Path, nodes: int):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "taehv_console.core.watch.agent",
                "--interval",
                "1",
                "--count",
                "1",
                "--replay",
                str(RECORDED),
                "--host-name",
                "node-00",
                "--run",
                str(run),
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.sample = json.loads(out.stdout.strip().splitlines()[-1])
        self.buffers: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._cpu: list[tuple[float, float]] = []  # (monotonic, thread CPU) after each round
        self.interval_s = 1.0  # the monitor's agent interval, set once it has chosen one
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stream(self, host: str) -> Any:
        replay = self
        with self.lock:
            self.buffers[host] = []

        class Stream:
            exited = False

            def read_lines(self) -> list[str]:
                with replay.lock:
                    lines, replay.buffers[host] = replay.buffers[host], []
                return lines

            def close(self) -> None:
                return None

        return Stream()

    def _loop(self) -> None:
        seq = 0
        while not self._stop.wait(self.interval_s):
            seq += 1
            with self.lock:
                hosts = list(self.buffers)
            lines = {
                h: json.dumps({**self.sample, "host": h, "time": time.time(), "seq": seq}) for h in hosts
            }
            with self.lock:
                for h, line in lines.items():
                    self.buffers[h].append(line)
            self._cpu.append((time.monotonic(), time.thread_time()))

    def cpu_s(self, since_mono: float) -> float:
        pts = [c for t, c in self._cpu if t >= since_mono]
        before = [c for t, c in self._cpu if t < since_mono]
        return (pts[-1] - (before[-1] if before else 0.0)) if pts else 0.0

    def stop(self) -> None:
        self._stop.set()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--events-per-s", type=float, default=10.0)
    ap.add_argument(
        "--heartbeats",
        action="store_true",
        help="also 8 heartbeat files per node, each replaced every second",
    )
    ap.add_argument(
        "--agents",
        choices=("process", "inproc"),
        default="process",
        help="agent processes (default), or recorded lines replayed in this process",
    )
    args = ap.parse_args()
    hosts = [f"node-{i:02d}" for i in range(args.nodes)]
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        (run / "heartbeat").mkdir(parents=True)
        (run / "logs").mkdir()
        for i in range(args.nodes):
            (run / "logs" / f"node-{i}.log").write_text("")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        writer = subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                str(run),
                str(8 * args.nodes if args.heartbeats else 0),
                str(args.events_per_s),
            ],
            env=env,
        )

        replay = _Replay(run, args.nodes) if args.agents == "inproc" else None

        def agent(host: str):
            if replay is not None:
                return replay.stream(host)
            return LocalLineStream(
                [
                    sys.executable,
                    "-m",
                    "taehv_console.core.watch.agent",
                    "--interval",
                    str(mon.agent_interval_s),
                    "--replay",
                    str(RECORDED),
                    "--host-name",
                    host,
                    "--run",
                    str(run),
                ]
            )

        published = []
        mon = Monitor(run, hosts=hosts, agent_stream=agent)
        if replay is not None:
            replay.interval_s = mon.agent_interval_s  # as agents started with the monitor's interval sample
        mon.subscribe(lambda s: published.append(s.seq))
        try:
            mon.start()
            deadline = time.time() + 120
            while time.time() < deadline:
                s = mon.snapshot()
                if sum(1 for n in s.nodes if n.sample is not None) == args.nodes and (s.run.step or 0) > 0:
                    break
                time.sleep(0.5)
            else:
                print("the agents did not all report within 120 s", file=sys.stderr)
                return 1
            time.sleep(args.warmup)
            n0, step0 = len(published), mon.snapshot().run.step
            c0, w0 = time.process_time(), time.monotonic()
            time.sleep(args.seconds)
            cpu, wall = time.process_time() - c0, time.monotonic() - w0
            if replay is not None:
                cpu -= replay.cpu_s(w0)  # the stand-in nodes are not the monitor
            s = mon.snapshot()
            samples = sum(len(series.points) for series in s.history.gpu_util)
            t0 = time.perf_counter()
            for _ in range(20):
                with mon._lock:
                    mon._build(time.time())
            build_ms = (time.perf_counter() - t0) / 20 * 1000
        finally:
            mon.stop()
            if replay is not None:
                replay.stop()
            writer.kill()
            writer.wait()
        print(
            f"followed {args.nodes} nodes x 8 GPUs (agent samples every {mon.agent_interval_s:g} s), rank-0 events at "
            f"{args.events_per_s:g}/s"
            + (f", {8 * args.nodes} heartbeats replaced every second" if args.heartbeats else "")
        )
        print(f"monitor CPU: {cpu:.2f} s over {wall:.1f} s = {100 * cpu / wall:.2f}% of one core")
        print(
            f"  {len(published) - n0} snapshots published ({(len(published) - n0) / wall:.1f}/s), steps "
            f"{step0} -> {s.run.step}, {len(s.nodes)} nodes ok: "
            f"{sum(1 for n in s.nodes if n.state.value == 'ok')}, {len(s.history.gpu_util)} GPU series "
            f"({samples} points)"
        )
        print(f"  one snapshot build: {build_ms:.1f} ms")
        print(
            json.dumps(
                {
                    "nodes": args.nodes,
                    "cpu_pct": round(100 * cpu / wall, 2),
                    "build_ms": round(build_ms, 2),
                    "published_per_s": round((len(published) - n0) / wall, 2),
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
