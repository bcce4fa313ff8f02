"""Flow step 1, detect: the topology (hostfile, platform env, SLURM, or this machine) and every
node's facts. Raises TopologyError / InvalidHostError / HostfileError for a wrong node list."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

from taehv_console.core.cluster.gather import node_path, probe_hosts
from taehv_console.core.cluster.hosts import HostfileError, read_hostfile
from taehv_console.core.cluster.platform import detect_topology
from taehv_console.core.cluster.probe import probe_node
from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.flow.options import FlowOptions
from taehv_console.core.models import ProbeResult, Topology


@dataclass(frozen=True)
class Detection:
    topology: Topology
    probes: tuple[ProbeResult, ...]


def probe_paths(options: FlowOptions) -> dict[str, str]:
    """The runs and data paths every probe also checks (as each node will read them)."""
    return {k: node_path(v) for k, v in (("runs", options.runs), ("data", options.data)) if v}


def hostfile_topology(options: FlowOptions) -> Topology:
    """The topology a hostfile (or the environment) describes; no node contacted yet."""
    return detect_topology(os.environ, options.hosts)


def spare_hosts(options: FlowOptions) -> tuple[str, ...]:
    """The hosts of --spares, in order (their slots are the run's): a HostfileError when the file
    is bad, when there is no hostfile run to spare, or when a spare is one of the run's hosts."""
    if not options.spares:
        return ()
    if not options.hosts:
        raise HostfileError(
            f"--spares {options.spares}: spare hosts replace nodes of a hostfile run; give --hosts too"
        )
    spares = tuple(n.host for n in read_hostfile(options.spares))
    both = sorted(set(spares) & set(hostfile_topology(options).hosts))
    if both:
        raise HostfileError(
            f"--spares {options.spares}: {', '.join(both)} is also in --hosts {options.hosts}; a spare "
            "is a host the run does not use"
        )
    return spares


def detect(options: FlowOptions, pool: SshPool | None = None) -> Detection:
    """Topology and every node's probe. With a hostfile the nodes are probed over SSH (through
    `pool`, or a pool of the options' settings); else this machine is probed in-process: no
    subprocess, and its clock is ours by definition. Spare hosts are read (and checked) first."""
    spare_hosts(options)
    paths = probe_paths(options)
    if options.hosts:
        topology = hostfile_topology(options)
        if pool is not None:
            return Detection(topology, tuple(probe_hosts(topology.hosts, pool, paths)))
        with SshPool(options.ssh) as own:
            return Detection(topology, tuple(probe_hosts(topology.hosts, own, paths)))
    facts = probe_node(paths)
    local = ProbeResult(host="localhost", facts=facts, seconds=facts.probe_seconds, clock_offset_s=0.0)
    topology = detect_topology(os.environ, None, local_gpus=facts.visible_gpu_count or None)
    return Detection(topology, (local,))


def probe_each(
    hosts: tuple[str, ...], pool: SshPool, paths: dict[str, str], on_result: Callable[[ProbeResult], object]
) -> tuple[ProbeResult, ...]:
    """Probe every host at once (one host per call) and report each result as it arrives, so a
    node table fills in while slow nodes are still answering."""
    results: dict[str, ProbeResult] = {}
    workers = max(1, min(len(hosts), pool.settings.max_parallel or 64))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="taehv-probe") as ex:
        futures = {ex.submit(probe_hosts, [h], pool, paths): h for h in hosts}
        for fut in as_completed(futures):
            result = fut.result()[0]
            results[futures[fut]] = result
            on_result(result)
    return tuple(results[h] for h in hosts)
