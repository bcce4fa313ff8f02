"""Launch and stop timing on 2 loopback "nodes" (127.0.0.2 and 127.0.0.3 over the test suite's
real sshd), one CPU DeepSpeed rank per node, cpu-smoke on generated clips.

Figures, per round and as the median over --repeat rounds:
- launch -> every launcher started (SSH + setsid wrapper on both nodes, pid/pgid recorded)
- launch -> first `start` event (accelerate, torchrun, DeepSpeed init, gloo rendezvous)
- launch -> first `step` event (the number the issue asks for)
- stop -> ranks' `stop` events (SIGTERM to the launcher groups; the trainer finishes its step
  and writes a checkpoint)
- stop -> nothing left running (every launcher tree on both nodes checked empty over SSH)
Both "nodes" share this machine's cores, so the numbers include that contention.

    python benchmarks/launch_timing.py [--repeat 2] [--steps-before-stop 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one_round(pool, runs: Path, clips: Path, port: int, steps_before_stop: int) -> dict[str, float]:
    from taehv_console.core.plan.presets import load_preset
    from taehv_console.core.run.control import RunController
    from taehv_console.core.run.create import LaunchSpec, create_run

    cfg = load_preset(
        "cpu-smoke",
        overrides=[
            f'data.source="{clips}"',
            "topology.nodes=2",
            "topology.gpus_per_node=1",
            "optim.max_steps=1000",
            "schedule.val_every=1000",
            "schedule.checkpoint_every=1000",
        ],
    ).config
    spec = LaunchSpec(
        backend="ssh",
        hosts=("127.0.0.2", "127.0.0.3"),
        master_addr="127.0.0.2",
        master_port=port,
        env={"OMP_NUM_THREADS": "1"},
    )
    run = create_run(runs, cfg, spec)
    marks: dict[str, float] = {}
    with RunController.open(run, pool, purpose="benchmark") as ctrl:
        t0 = time.time()
        ctrl.launch()
        marks["launchers started"] = time.time() - t0
        tail = ctrl._tail()
        while True:
            for e in tail.poll():
                if e["kind"] == "start":
                    marks.setdefault("first start event", e["time"] - t0)
                if e["kind"] == "step":
                    marks.setdefault("first step event", e["time"] - t0)
            if tail.progress.step >= steps_before_stop:
                break
            if time.time() - t0 > 600:
                raise RuntimeError(f"no step {steps_before_stop} within 600 s; see {run.logs}")
            time.sleep(0.05)
        t1 = time.time()
        record = ctrl.stop(grace_s=120)
        marks["stop -> nothing left"] = record.finished - t1
        marks["stop -> ranks' stop events"] = max(e["time"] for e in tail.progress.stops.values()) - t1
        if not record.verified:
            raise RuntimeError(f"stop did not verify an empty tree on every node: {ctrl.state.stop}")
    return marks


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--steps-before-stop", type=int, default=2)
    args = p.parse_args()

    from taehv_console.core.cluster.ssh import SshPool
    from tests.conftest import LoopbackSshd
    from trainer.synthetic import make_synthetic

    with tempfile.TemporaryDirectory(prefix="taehv-launch-bench-") as tmp:
        work = Path(tmp)
        clips = work / "clips"
        make_synthetic(clips, clips=8, frames=12, height=64, width=64, seed=0)
        sshd = LoopbackSshd(work / "sshd", n_hosts=2).start()
        rounds = []
        try:
            with SshPool(sshd.settings()) as pool:
                for i in range(args.repeat):
                    import socket

                    with socket.socket() as s:
                        s.bind(("127.0.0.2", 0))
                        port = s.getsockname()[1]
                    marks = one_round(pool, work / "runs", clips, port, args.steps_before_stop)
                    rounds.append(marks)
                    print(
                        f"round {i + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in marks.items()), flush=True
                    )
        finally:
            sshd.stop()
    print("\nmedian over", len(rounds), "round(s), 2 loopback nodes x 1 CPU rank, cpu-smoke 8x64x64:")
    for key in rounds[0]:
        print(f"  {key:28s} {statistics.median(r[key] for r in rounds):6.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
