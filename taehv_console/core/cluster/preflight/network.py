"""Checks of how the nodes reach each other: reachability, the master port, and the measured
all-reduce bandwidth against the plan's assumption."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from taehv_console.core.cluster.preflight.findings import E, I, W
from taehv_console.core.hostnames import host_port
from taehv_console.core.models import BandwidthResult, Finding, ProbeResult


def check_reachability(probes: Sequence[ProbeResult]) -> list[Finding]:
    return [
        Finding("node-unreachable", E, p.error or f"{p.host}: no facts", p.fix, p.host)
        for p in probes
        if not p.ok
    ]


def check_one_machine_twice(probes: Sequence[ProbeResult]) -> list[Finding]:
    """Entries of one node list that reached the same machine (the same boot id and hostname:
    `localhost` and `127.0.0.1`, a name and its address). Two nodes on one machine's GPUs would
    put two ranks on each (NCCL refuses that): an error. Without a GPU in common they only share
    its CPUs and memory, which is how a cluster is tested on one machine: a warning."""
    machines: dict[tuple[str, str], list[ProbeResult]] = {}
    for p in probes:
        if p.facts is not None and p.facts.boot_id:
            machines.setdefault((p.facts.boot_id, p.facts.hostname), []).append(p)
    out = []
    for (boot, hostname), same in machines.items():
        if len(same) < 2:
            continue
        names = " and ".join(repr(p.host) for p in same)
        where = f"{names} are one machine ({hostname}, boot id {boot[:8]})"
        fix = "list the machine once, with all its slots"
        shared = set.intersection(*(set(p.facts.visible_gpu_indices) for p in same if p.facts))
        if shared:
            gpus = ", ".join(str(i) for i in sorted(shared))
            out.append(
                Finding(
                    "one-machine-twice",
                    E,
                    f"{where}: as {len(same)} nodes they would each start ranks on its GPU(s) {gpus}, "
                    "and NCCL refuses two ranks on one GPU",
                    fix,
                    same[1].host,
                )
            )
        else:
            out.append(
                Finding(
                    "one-machine-twice",
                    W,
                    f"{where}: as {len(same)} nodes they share its CPUs, memory and disks "
                    "(a test of several nodes on one machine; on a cluster, rarely meant)",
                    fix,
                    same[1].host,
                )
            )
    return out


def check_master_port(
    port: int,
    master: str,
    free: tuple[bool, str] | None,
    reach: Mapping[str, tuple[bool, str]],
    one_node: bool = False,
) -> list[Finding]:
    """The rendezvous port: free on the master, reachable from every worker. A one-node run does
    not need it free: accelerate launches one machine standalone on a free port when its own is
    taken (utils/launch.py), so there a taken port is said, not an error."""
    out = []
    if free is not None and not free[0] and one_node:
        return [
            Finding(
                "master-port-taken",
                I,
                f"{master}: port {port} is in use ({free[1]}); a one-node run launches on a free port "
                "instead (accelerate's standalone rendezvous)",
                node=master,
            )
        ]
    if free is not None and not free[0]:
        out.append(
            Finding(
                "master-port-busy",
                E,
                f"{master}: master port {port} is in use ({free[1]})",
                "stop what holds it, or set MASTER_PORT to a free port",
                master,
            )
        )
        return out
    for host, (ok, why) in reach.items():
        if not ok:
            out.append(
                Finding(
                    "master-port-unreachable",
                    E,
                    f"{host}: cannot reach the master {host_port(master, port)} ({why})",
                    f"open TCP {port} on {master} to the other nodes (firewall, security group), "
                    "or check that the master address resolves to an address they can route to",
                    host,
                )
            )
    return out


def bandwidth_finding(result: BandwidthResult, assumed_gbps: float | None = None) -> Finding:
    text = (
        f"all-reduce of {result.bytes / 1e6:.0f} MB across {result.nodes} nodes ({result.backend}): "
        f"algbw {result.algbw_gbps:.3f} GB/s, busbw {result.busbw_gbps:.3f} GB/s "
        f"({result.busbw_gbps * 8:.2f} Gbit/s per link)"
    )
    if assumed_gbps is not None:
        ratio = result.busbw_gbps * 8 / assumed_gbps if assumed_gbps else 0
        text += f"; the plan assumed {assumed_gbps:g} Gbit/s"
        if ratio < 0.5:
            return Finding(
                "bandwidth-low",
                W,
                text + f" (measured is {ratio:.0%} of it)",
                "re-plan with the measured figure, check NCCL_SOCKET_IFNAME/InfiniBand settings",
            )
    return Finding("bandwidth", I, text)
