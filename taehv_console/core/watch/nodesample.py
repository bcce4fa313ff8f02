"""One node at one instant, as its agent reported it: the GPUs, processes, disks and kernel-log
Xids of an agent line (parsed by core/watch/nodeline.py). Plain frozen data, re-exported by
core/watch/state.py with the rest of the watch layer's values."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant, as the node's agent read it through NVML. None = not reported
    (NVML answers NotSupported for some fields on some boards)."""

    index: int
    name: str = ""
    uuid: str = ""
    util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used_mb: float | None = None
    mem_total_mb: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    # GPU memory held by this run's processes (the others on the GPU are someone else's).
    run_mem_mb: float = 0.0
    run_pids: tuple[int, ...] = ()
    # Clock slowdowns that cost speed (thermal, power brake, hardware slowdown); idle is not one.
    throttle: tuple[str, ...] = ()
    error: str = ""  # NVML failed for this device, e.g. "GPU is lost"
    # Uncorrectable ECC errors since the driver loaded (NVML's volatile count); None: the board has
    # no ECC or it is off, or an older agent that did not report it.
    ecc_uncorrected: int | None = None


@dataclass(frozen=True)
class ProcessSample:
    """One of the run's processes on a node (pid from its heartbeat)."""

    pid: int
    rank: int | None = None
    # psutil's status names (running, sleeping, disk-sleep, stopped, zombie, ...) or "gone".
    status: str = "gone"
    cpu_pct: float | None = None
    rss_mb: float | None = None
    gpu_mem_mb: float = 0.0

    @property
    def alive(self) -> bool:
        return self.status not in ("gone", "zombie", "dead")


@dataclass(frozen=True)
class DiskSample:
    path: str
    used_gb: float
    total_gb: float
    free_gb: float


@dataclass(frozen=True)
class XidEvent:
    """An Xid line of NVIDIA's driver in a node's kernel log (core/watch/kmsg.py)."""

    code: int
    pci: str  # the GPU's PCI address, as the driver names it
    text: str = ""


@dataclass(frozen=True)
class NodeSample:
    """One line of a node agent: what changes on the node (GPUs, CPU, RAM, disk, network, the
    run's processes). `time` is the node's clock; `received` is the console's, set on receipt."""

    host: str
    time: float
    seq: int = 0
    interval_s: float = 1.0
    gpu_ok: bool = False  # False: no GPU or no NVML on this node (a CPU-only sample)
    gpu_reason: str = ""
    gpus: tuple[GpuSample, ...] = ()
    cpu_pct: float | None = None
    cpu_count: int = 0
    load1: float | None = None
    ram_used_gb: float | None = None
    ram_total_gb: float | None = None
    disks: tuple[DiskSample, ...] = ()
    net_rx_mbps: float | None = None
    net_tx_mbps: float | None = None
    processes: tuple[ProcessSample, ...] = ()
    agent_pid: int = 0
    received: float = 0.0
    xids: tuple[XidEvent, ...] = ()  # seen in the kernel log since the agent started
    xid_reason: str = ""  # why the kernel log is not read ("" when it is)

    def process(self, pid: int) -> ProcessSample | None:
        for p in self.processes:
            if p.pid == pid:
                return p
        return None
