"""Which machines take part, read from the first source that describes them: a hostfile, a
per-process launcher's env, a platform's node-level env (PAI-DLC, Kubeflow), a Kubernetes Indexed
Job, SLURM, or else this machine alone. The Topology says which source won and how it was read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from taehv_console.core.cluster.hosts import (
    HostfileError,
    InvalidHostError,
    expand_slurm_hostlist,
    read_hostfile,
    validate_host,
)
from taehv_console.core.models import NodeSpec, Topology, TopologySource

DEFAULT_MASTER_PORT = 29500


class TopologyError(ValueError):
    """The environment or hostfile describes a cluster that cannot be used as it is."""


def detect_topology(
    env: Mapping[str, str] | None = None,
    hostfile: str | Path | None = None,
    *,
    local_gpus: int | None = None,
) -> Topology:
    """Detect the topology. `local_gpus` (this machine's visible GPUs) fills slots where the
    source does not state them and helps read node-level platform env."""
    env = os.environ if env is None else env
    if hostfile is not None:
        return _from_hostfile(hostfile, env)
    if all(k in env for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        return _from_launcher_env(env, local_gpus)
    if "WORLD_SIZE" in env and "RANK" in env:
        return _from_node_env(env, local_gpus)
    if "JOB_COMPLETION_INDEX" in env:
        return _from_indexed_job(env, local_gpus)
    if "SLURM_JOB_NODELIST" in env or "SLURM_NODELIST" in env:
        return _from_slurm(env)
    return Topology(
        source=TopologySource.LOCAL,
        node_count=1,
        nodes=(NodeSpec("localhost", 0, local_gpus or None),),
        this_node_rank=0,
        master_addr="127.0.0.1",
        master_port=_port(env),
        processes_per_node=local_gpus or None,
        detail="no hostfile and no launcher or platform variables: this machine alone",
    )


def _int(env: Mapping[str, str], name: str, *, minimum: int = 0) -> int:
    raw = env[name]
    if not re.fullmatch(r"\s*\d+\s*", raw) or int(raw) < minimum:
        raise TopologyError(f"environment variable {name}={raw!r} is not a whole number ≥ {minimum}")
    return int(raw)


def _opt_int(env: Mapping[str, str], *names: str, minimum: int = 1) -> int | None:
    for name in names:
        if name in env and re.fullmatch(r"\s*\d+\s*", env[name]):
            return _int(env, name, minimum=minimum)
    return None


def _port(env: Mapping[str, str], *names: str) -> int:
    for name in names or ("MASTER_PORT",):
        if name in env:
            port = _int(env, name, minimum=1)
            if port > 65535:
                raise TopologyError(f"environment variable {name}={env[name]!r} is not a TCP port")
            return port
    return DEFAULT_MASTER_PORT


def _host(env: Mapping[str, str], name: str) -> str:
    try:
        return validate_host(env[name].strip())
    except InvalidHostError as err:
        raise TopologyError(f"environment variable {name}: {err}") from None


def _from_hostfile(path: str | Path, env: Mapping[str, str]) -> Topology:
    try:
        nodes = read_hostfile(path)
    except HostfileError as err:
        raise TopologyError(str(err)) from None
    return Topology(
        source=TopologySource.HOSTFILE,
        node_count=len(nodes),
        nodes=nodes,
        this_node_rank=None,
        master_addr=nodes[0].host,
        master_port=_port(env),
        processes_per_node=nodes[0].slots if len({n.slots for n in nodes}) == 1 else None,
        detail=f"hostfile {path}: {len(nodes)} node(s); machine rank = line order",
    )


def _from_launcher_env(env: Mapping[str, str], local_gpus: int | None) -> Topology:
    world = _int(env, "WORLD_SIZE", minimum=1)
    rank = _int(env, "RANK")
    local_rank = _int(env, "LOCAL_RANK")
    if rank >= world:
        raise TopologyError(f"RANK={rank} is not below WORLD_SIZE={world}")
    notes = []
    local_world = _opt_int(env, "LOCAL_WORLD_SIZE")
    if local_world is None:
        local_world = local_gpus or None
        notes.append(
            "LOCAL_WORLD_SIZE is not set: processes per node taken from this node's GPUs"
            if local_world
            else "LOCAL_WORLD_SIZE is not set: processes per node unknown"
        )
    if local_world and local_rank >= local_world:
        raise TopologyError(f"LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world}")
    if local_world and world % local_world:
        raise TopologyError(
            f"WORLD_SIZE={world} is not a multiple of the {local_world} processes per node: "
            "nodes must all run the same number of processes"
        )
    nodes = world // local_world if local_world else 1
    node_rank = _opt_int(env, "GROUP_RANK", "NODE_RANK", minimum=0)
    if node_rank is None and local_world:
        node_rank = rank // local_world
    return Topology(
        source=TopologySource.LAUNCHER_ENV,
        node_count=nodes,
        this_node_rank=node_rank,
        master_addr=_host(env, "MASTER_ADDR") if "MASTER_ADDR" in env else "127.0.0.1",
        master_port=_port(env),
        processes_per_node=local_world,
        detail=(
            f"per-process launcher variables (torchrun/accelerate): process {rank} of {world}, "
            f"local rank {local_rank}; the launcher has already started every process"
        ),
        notes=tuple(notes),
    )


def _from_node_env(env: Mapping[str, str], local_gpus: int | None) -> Topology:
    # WORLD_SIZE and RANK without LOCAL_RANK: the PAI-DLC / Kubeflow convention, where they count
    # pods (nodes), not processes. A per-process launcher always sets LOCAL_RANK as well.
    world = _int(env, "WORLD_SIZE", minimum=1)
    rank = _int(env, "RANK")
    if rank >= world:
        raise TopologyError(f"RANK={rank} is not below WORLD_SIZE={world}")
    notes = ["WORLD_SIZE/RANK without LOCAL_RANK: read as node count and node index, not processes"]
    if any(k.startswith("PET_") for k in env):
        source, name = TopologySource.KUBEFLOW, "Kubeflow PyTorchJob"
        ppn = _opt_int(env, "PET_NPROC_PER_NODE")
        if (
            "PET_NNODES" in env
            and re.fullmatch(r"\d+", env["PET_NNODES"])
            and int(env["PET_NNODES"]) != world
        ):
            notes.append(
                f"PET_NNODES={env['PET_NNODES']} disagrees with WORLD_SIZE={world}; using WORLD_SIZE"
            )
    elif "NPROC_PER_NODE" in env or re.match(r"dlc[0-9a-z]+-master-0", env.get("MASTER_ADDR", "")):
        source, name = TopologySource.PAI_DLC, "Aliyun PAI-DLC"
        ppn = _opt_int(env, "NPROC_PER_NODE")
    else:
        source, name = TopologySource.NODE_ENV, "node-level platform variables"
        ppn = None
        notes.append("no platform marker (PET_*, NPROC_PER_NODE, dlc* master): platform not identified")
    if ppn is None and local_gpus:
        ppn = local_gpus
        notes.append(f"processes per node taken from this node's {local_gpus} GPU(s)")
    if ppn and local_gpus and ppn != local_gpus:
        notes.append(f"the platform says {ppn} processes per node but this node sees {local_gpus} GPU(s)")
    addr_var = (
        "MASTER_ADDR" if "MASTER_ADDR" in env else "PET_MASTER_ADDR" if "PET_MASTER_ADDR" in env else ""
    )
    if not addr_var:
        raise TopologyError(f"WORLD_SIZE and RANK are set ({name}) but MASTER_ADDR is not")
    return Topology(
        source=source,
        node_count=world,
        this_node_rank=rank,
        master_addr=_host(env, addr_var),
        master_port=_port(env, "MASTER_PORT", "PET_MASTER_PORT"),
        processes_per_node=ppn,
        detail=f"{name}: node {rank} of {world}; the platform starts every node",
        notes=tuple(notes),
    )


def _from_indexed_job(env: Mapping[str, str], local_gpus: int | None) -> Topology:
    index = _int(env, "JOB_COMPLETION_INDEX")
    nodes = _opt_int(env, "NNODES", "TAEHV_NODES")
    if nodes is None:
        raise TopologyError(
            f"Kubernetes Indexed Job (JOB_COMPLETION_INDEX={index}) but the node count is unknown: "
            "set NNODES in the pod template to the Job's .spec.completions"
        )
    if index >= nodes:
        raise TopologyError(f"JOB_COMPLETION_INDEX={index} is not below NNODES={nodes}")
    notes = []
    if "MASTER_ADDR" in env:
        master = _host(env, "MASTER_ADDR")
    else:
        # Pods of an Indexed Job are named <job>-<index>; pod 0 is the master.
        m = re.fullmatch(r"(.+)-(\d+)", env.get("HOSTNAME", ""))
        if not m or int(m.group(2)) != index:
            raise TopologyError(
                "Kubernetes Indexed Job without MASTER_ADDR, and HOSTNAME is not "
                "<job>-<index>: set MASTER_ADDR to pod 0's address"
            )
        master = validate_host(f"{m.group(1)}-0")
        notes.append(
            f"MASTER_ADDR not set: using {master}; it resolves only through a headless "
            f"Service (then set MASTER_ADDR={master}.<service>)"
        )
    return Topology(
        source=TopologySource.K8S_INDEXED_JOB,
        node_count=nodes,
        this_node_rank=index,
        master_addr=master,
        master_port=_port(env),
        processes_per_node=_opt_int(env, "NPROC_PER_NODE") or local_gpus,
        detail=f"Kubernetes Indexed Job: pod {index} of {nodes}; Kubernetes starts every pod",
        notes=tuple(notes),
    )


def _from_slurm(env: Mapping[str, str]) -> Topology:
    var = "SLURM_JOB_NODELIST" if "SLURM_JOB_NODELIST" in env else "SLURM_NODELIST"
    try:
        hosts = expand_slurm_hostlist(env[var])
    except (ValueError, InvalidHostError) as err:
        raise TopologyError(f"{var}: {err}") from None
    if not hosts:
        raise TopologyError(f"{var} is empty")
    notes = []
    declared = _opt_int(env, "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    if declared is not None and declared != len(hosts):
        notes.append(f"SLURM_NNODES={declared} but {var} names {len(hosts)} host(s); using the list")
    slots = _opt_int(env, "SLURM_GPUS_ON_NODE")
    node_id = _opt_int(env, "SLURM_NODEID", minimum=0)
    job = env.get("SLURM_JOB_ID", "?")
    return Topology(
        source=TopologySource.SLURM,
        node_count=len(hosts),
        nodes=tuple(NodeSpec(h, i, slots) for i, h in enumerate(hosts)),
        this_node_rank=node_id,
        master_addr=hosts[0],
        master_port=_port(env),
        processes_per_node=slots,
        detail=f"SLURM job {job}: {len(hosts)} node(s) from {var}",
        notes=tuple(notes),
    )
