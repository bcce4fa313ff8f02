"""A short all-reduce between the nodes (one process per node) with torch.distributed, reported the
way nccl-tests does: algbw = bytes / time, busbw = algbw × 2(N−1)/N (what each link carried).

Each node runs `python -m taehv_console.core.cluster.bandwidth --rank R ...`; rank 0 prints the
result as JSON, the others {"rank": R}. `measure_bandwidth` starts them all over the node runners
and collects it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Mapping, Sequence

from taehv_console.core.cluster.nodecall import NodeReply
from taehv_console.core.cluster.ssh import SshError, fan_out
from taehv_console.core.hostnames import host_port
from taehv_console.core.models import BandwidthResult

MODULE = "taehv_console.core.cluster.bandwidth"
_RESULT_KEYS = (
    "backend",
    "nodes",
    "bytes",
    "iterations",
    "seconds_per_iteration",
    "algbw_gbps",
    "busbw_gbps",
)


def bus_bandwidth(algbw: float, nodes: int) -> float:
    """All-reduce bus bandwidth: a ring moves 2(N−1)/N of the buffer over every link."""
    return algbw * 2 * (nodes - 1) / nodes if nodes > 1 else 0.0


def result_from_timing(
    backend: str, nodes: int, nbytes: int, iterations: int, seconds: float
) -> BandwidthResult:
    algbw = nbytes / seconds / 1e9 if seconds > 0 else 0.0
    return BandwidthResult(
        backend=backend,
        nodes=nodes,
        bytes=nbytes,
        iterations=iterations,
        seconds_per_iteration=seconds,
        algbw_gbps=round(algbw, 4),
        busbw_gbps=round(bus_bandwidth(algbw, nodes), 4),
    )


def worker(
    rank: int,
    world: int,
    master: str,
    port: int,
    nbytes: int,
    iterations: int,
    backend: str,
    timeout_s: float,
) -> BandwidthResult | None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        backend,
        init_method=f"tcp://{host_port(master, port)}",  # [v6]:port, as URLs spell it
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    try:
        device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize()

        for _ in range(2):  # warm-up: connection setup and buffer registration are not bandwidth
            dist.all_reduce(x)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iterations):
            dist.all_reduce(x)
        sync()
        elapsed = torch.tensor([(time.perf_counter() - t0) / iterations], dtype=torch.float64, device=device)
        # The slowest rank's time is the collective's time.
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        if rank == 0:
            return result_from_timing(backend, world, x.numel() * 4, iterations, float(elapsed.item()))
        return None
    finally:
        dist.destroy_process_group()


def measure_bandwidth(
    runners: Sequence,
    master_addr: str,
    port: int,
    *,
    megabytes: float = 64,
    iterations: int = 5,
    backend: str = "gloo",
    env: Mapping[str, str] | None = None,
    timeout_s: float = 120,
) -> BandwidthResult:
    """Run one rank per runner (runner i is rank i) at once; return rank 0's figures."""
    world = len(runners)
    nbytes = int(megabytes * 1e6)

    def one(i: str) -> NodeReply:
        r = runners[int(i)]
        args = [
            "--rank",
            i,
            "--world-size",
            str(world),
            "--master-addr",
            master_addr,
            "--master-port",
            str(port),
            "--bytes",
            str(nbytes),
            "--iterations",
            str(iterations),
            "--backend",
            backend,
            "--timeout",
            str(timeout_s),
        ]
        return r.call(
            MODULE,
            args,
            timeout=timeout_s + 30,
            env=dict(env or {}),
            require=_RESULT_KEYS if i == "0" else ("rank",),
        )

    results = fan_out([str(i) for i in range(world)], one, max_parallel=world)
    failures = []
    for i, res in results.items():
        host = runners[int(i)].host
        if isinstance(res, Exception):
            failures.append(f"{host}: {res}")
        elif not res.ok:
            failures.append(res.why)
    if failures:
        raise SshError(
            runners[0].host,
            "all-reduce test failed: " + "; ".join(failures),
            "check that the master port is reachable and the NCCL/GLOO socket settings",
        )
    leader = results["0"]
    assert not isinstance(leader, Exception)  # any failure raised above
    return BandwidthResult(**{k: leader.data[k] for k in _RESULT_KEYS})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, required=True)
    p.add_argument("--bytes", type=int, default=64_000_000)
    p.add_argument("--iterations", type=int, default=5)
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    p.add_argument("--timeout", type=float, default=120)
    a = p.parse_args(argv)
    result = worker(
        a.rank, a.world_size, a.master_addr, a.master_port, a.bytes, a.iterations, a.backend, a.timeout
    )
    # every rank answers, so the console reads each the same way; rank 0 with the figures
    print(json.dumps(result.to_dict() if result is not None else {"rank": a.rank}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
