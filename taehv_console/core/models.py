"""Immutable values the core hands around: what a node is (NodeFacts), how the nodes form a cluster
(Topology), and what preflight found (Finding). Plain data only, so the UI, the headless front end
and the JSON output all render the same snapshot.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, fields
from typing import Any


class Severity(str, enum.Enum):
    """How much a finding matters: errors stop a launch, warnings are shown and do not."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        # Sort key: errors first.
        return {"error": 0, "warning": 1, "info": 2}[self.value]


@dataclass(frozen=True)
class Finding:
    """One preflight result: `id` is stable (tests and scripts match on it), `fix` says what to do."""

    id: str
    severity: Severity
    message: str
    fix: str = ""
    node: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity.value,
            "node": self.node,
            "message": self.message,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU as NVML numbers it (the index ignores CUDA_VISIBLE_DEVICES)."""

    index: int
    name: str
    memory_total_mb: int
    uuid: str = ""
    pci_bus_id: str = ""

    @property
    def memory_gb(self) -> float:
        return self.memory_total_mb / 1024


@dataclass(frozen=True)
class PathInfo:
    """A path a run needs on a node (runs dir, data source): whether it is there and the free space."""

    label: str
    path: str
    exists: bool
    readable: bool = False
    writable: bool = False
    is_dir: bool = False
    # Free/total space of the filesystem holding the path (or its nearest existing parent).
    free_gb: float | None = None
    total_gb: float | None = None
    fs_path: str = ""


@dataclass(frozen=True)
class NetInterface:
    name: str
    addresses: tuple[str, ...] = ()
    is_up: bool = True


@dataclass(frozen=True)
class NodeFacts:
    """What one machine has, as the probe saw it. `gpu_reason` explains an empty `gpus` list."""

    hostname: str
    addresses: tuple[str, ...] = ()
    # this boot's random id ("" where unreadable): with the hostname, which machine answered, so two
    # names for one machine in a hostfile are told apart from two machines
    boot_id: str = ""
    gpus: tuple[GpuInfo, ...] = ()
    gpu_reason: str = ""
    driver_version: str = ""
    cuda_driver_version: str = ""
    # Raw CUDA_VISIBLE_DEVICES (None = unset) and the physical indices it leaves visible, in order.
    cuda_visible_devices: str | None = None
    visible_gpu_indices: tuple[int, ...] = ()
    # Entries of CUDA_VISIBLE_DEVICES naming no GPU here (an ordinal beyond the count, an unknown UUID).
    invalid_visible_entries: tuple[str, ...] = ()
    cpu_count: int = 0
    ram_gb: float = 0.0
    paths: tuple[PathInfo, ...] = ()
    python_version: str = ""
    python_executable: str = ""
    torch_version: str | None = None
    torch_cuda_version: str | None = None
    nccl_version: str | None = None
    nccl_reason: str = ""
    deepspeed_version: str | None = None
    accelerate_version: str | None = None
    taehv_console_version: str | None = None
    ib_devices: tuple[str, ...] = ()
    interfaces: tuple[NetInterface, ...] = ()
    # NCCL_*/GLOO_*/CUDA_* variables set in the node's own environment (what a launch inherits).
    comm_env: tuple[tuple[str, str], ...] = ()
    clock: float = 0.0
    probe_seconds: float = 0.0

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def visible_gpus(self) -> tuple[GpuInfo, ...]:
        by_index = {g.index: g for g in self.gpus}
        return tuple(by_index[i] for i in self.visible_gpu_indices if i in by_index)

    @property
    def visible_gpu_count(self) -> int:
        return len(self.visible_gpu_indices)

    def path(self, label: str) -> PathInfo | None:
        for p in self.paths:
            if p.label == label:
                return p
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NodeFacts:
        """Inverse of to_dict; unknown keys are ignored so an older console reads a newer probe."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in data.items() if k in known}
        kw["gpus"] = tuple(GpuInfo(**_only(GpuInfo, g)) for g in kw.get("gpus", ()))
        kw["paths"] = tuple(PathInfo(**_only(PathInfo, p)) for p in kw.get("paths", ()))
        kw["interfaces"] = tuple(
            NetInterface(**{**_only(NetInterface, i), "addresses": tuple(i.get("addresses", ()))})
            for i in kw.get("interfaces", ())
        )
        kw["comm_env"] = tuple((str(k), str(v)) for k, v in kw.get("comm_env", ()))
        for name in ("addresses", "visible_gpu_indices", "invalid_visible_entries", "ib_devices"):
            if name in kw:
                kw[name] = tuple(kw[name])
        return cls(**kw)


def _only(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    known = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in known}


class BackendKind(str, enum.Enum):
    """How a run's nodes are started; state.json stores the value (a str enum: a kind read back
    compares equal to the member). The controller and the flow dispatch on this, never on strings."""

    LOCAL = "local"
    SSH = "ssh"
    PLATFORM = "platform"  # one pod per node, each starting its own (Kubernetes, PAI-DLC ...)
    SLURM = "slurm"  # inside an allocation: srun starts every node
    SBATCH = "sbatch"  # from a login node: the submitted job is the launcher

    @property
    def slurm(self) -> bool:
        """SLURM starts every node: this console expects every node's exit status."""
        return self in (BackendKind.SLURM, BackendKind.SBATCH)


class TopologySource(str, enum.Enum):
    """Where the list of nodes came from, in the order detection tries them."""

    HOSTFILE = "hostfile"
    LAUNCHER_ENV = "launcher-env"  # torchrun / accelerate per-process variables
    PAI_DLC = "pai-dlc"
    KUBEFLOW = "kubeflow"
    NODE_ENV = "node-env"  # node-level WORLD_SIZE/RANK of an unidentified platform
    K8S_INDEXED_JOB = "k8s-indexed-job"
    SLURM = "slurm"
    LOCAL = "local"


@dataclass(frozen=True)
class NodeSpec:
    """One machine of the run: how to reach it and how many training processes it takes."""

    host: str
    machine_rank: int
    slots: int | None = None  # None: not stated by the source (decided from the node's GPUs)


@dataclass(frozen=True)
class Topology:
    """The nodes of a run and which source described them.

    `nodes` lists the hosts the source names; platforms that start every node themselves (PAI,
    Kubeflow, Indexed Job, a per-process launcher) may give only a count (`node_count`) and this
    node's rank. `notes` say how an ambiguous environment was read.
    """

    source: TopologySource
    node_count: int
    nodes: tuple[NodeSpec, ...] = ()
    this_node_rank: int | None = None
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    processes_per_node: int | None = None
    detail: str = ""
    notes: tuple[str, ...] = ()

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(n.host for n in self.nodes)

    @property
    def uses_ssh(self) -> bool:
        """Whether the console itself reaches the other nodes (only for a hostfile it was given)."""
        return self.source is TopologySource.HOSTFILE

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["source"] = self.source.value
        return d


@dataclass(frozen=True)
class CommandResult:
    """The outcome of one command on one node (over SSH or locally)."""

    host: str
    argv: tuple[str, ...]
    exit_status: int
    stdout: str
    stderr: str
    seconds: float
    started_at: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_status == 0


@dataclass(frozen=True)
class ProbeResult:
    """Facts of one node, or why they could not be had. `clock_offset_s` is the node's clock minus
    the console's, bounded by the round trip (0 when the node's clock falls inside it)."""

    host: str
    facts: NodeFacts | None = None
    error: str = ""
    fix: str = ""
    seconds: float = 0.0
    clock_offset_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.facts is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "ok": self.ok,
            "error": self.error,
            "fix": self.fix,
            "seconds": round(self.seconds, 3),
            "clock_offset_s": self.clock_offset_s,
            "facts": self.facts.to_dict() if self.facts else None,
        }


@dataclass(frozen=True)
class BandwidthResult:
    """A short all-reduce between the nodes (one process per node), as nccl-tests report it."""

    backend: str
    nodes: int
    bytes: int
    iterations: int
    seconds_per_iteration: float
    algbw_gbps: float  # GB/s (1e9 bytes), bytes / time
    busbw_gbps: float  # algbw × 2(N−1)/N, what each link carried

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PreflightReport:
    topology: Topology
    probes: tuple[ProbeResult, ...]
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    bandwidth: BandwidthResult | None = None

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity is Severity.ERROR)

    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "topology": self.topology.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "nodes": [p.to_dict() for p in self.probes],
            "bandwidth": self.bandwidth.to_dict() if self.bandwidth else None,
        }
