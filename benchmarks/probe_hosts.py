"""Wall time to probe N loopback "nodes" over real SSH (N = 1, 4, 16 by default).

Starts the test suite's loopback sshd (tests/conftest.py) on 127.0.0.2 ... and, for each N,
probes N hosts the way `detect` does: cold (new pool: TCP + SSH handshake + probe) and warm
(connections kept: the probe command alone), and the fan-out of `true` (SSH alone). Prints the median of --repeat rounds, and the sum
of the per-host times for comparison: a parallel fan-out keeps the wall time near one round trip
while the sum grows with N. All "nodes" share this machine's CPUs, so on a small machine the
remote probes compete for cores and the wall time rises with N for that reason alone.

    python benchmarks/probe_hosts.py [--sizes 1 4 16] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.conftest: the loopback sshd


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()

    from taehv_console.core.cluster.gather import probe_hosts
    from taehv_console.core.cluster.ssh import SshPool
    from tests.conftest import LoopbackSshd

    sshd = LoopbackSshd(tempfile.mkdtemp(prefix="taehv-bench-sshd-"), n_hosts=max(args.sizes)).start()
    try:
        settings = sshd.settings()
        print(
            f"machine: {os.cpu_count()} CPU(s); probe = {settings.python} -m taehv_console.core.cluster.probe"
        )
        print(
            f"{'N':>3}  {'cold wall s':>11}  {'warm wall s':>11}  {'sum of per-host s':>17}  "
            f"{'slowest host s':>14}  {'warm `true` wall s':>18}"
        )
        for n in args.sizes:
            hosts = sshd.addresses[:n]
            cold, warm, sums, slowest, bare = [], [], [], [], []
            for _ in range(args.repeat):
                with SshPool(settings) as pool:
                    t0 = time.perf_counter()
                    res = probe_hosts(hosts, pool)
                    cold.append(time.perf_counter() - t0)
                    assert all(r.ok for r in res), [r.error for r in res if not r.ok]
                    t0 = time.perf_counter()
                    res = probe_hosts(hosts, pool)
                    warm.append(time.perf_counter() - t0)
                    sums.append(sum(r.seconds for r in res))
                    slowest.append(max(r.seconds for r in res))
                    # The fan-out alone: a command that costs the node nothing.
                    t0 = time.perf_counter()
                    done = pool.run_all(hosts, ["true"])
                    bare.append(time.perf_counter() - t0)
                    assert all(getattr(r, "ok", False) for r in done.values())
            print(
                f"{n:>3}  {statistics.median(cold):>11.3f}  {statistics.median(warm):>11.3f}  "
                f"{statistics.median(sums):>17.3f}  {statistics.median(slowest):>14.3f}  "
                f"{statistics.median(bare):>18.3f}"
            )
    finally:
        sshd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
