"""Facts of the machine this runs on (GPUs, CPUs, memory, disks, versions, network, clock).

Runs locally or on a remote node as `python -m taehv_console.core.cluster.probe [--path LABEL=PATH]`,
printing one JSON object (NodeFacts.to_dict). It never imports torch: a probe of 64 nodes must stay
well under a second per node, and versions are read from package metadata instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Callable, Mapping
from importlib import metadata, util
from pathlib import Path
from typing import Any

import psutil

from taehv_console.core.cluster.spawn import boot_id
from taehv_console.core.models import GpuInfo, NetInterface, NodeFacts, PathInfo

# Environment a launch inherits that decides how collectives talk; recorded so preflight can check it.
COMM_ENV_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_")

NvmlReading = dict[str, Any]


def read_nvml() -> NvmlReading:
    """Ask NVML about the GPUs. The result is plain data (recorded samples in tests have this shape):
    {"ok": bool, "reason": str, "driver_version": str, "cuda_driver_version": int (e.g. 12040),
     "devices": [{"index", "name", "memory_total" (bytes), "uuid", "pci_bus_id"}]}.
    Any failure (no library, no driver, no GPU) is an answer with ok=False and the reason."""
    try:
        import pynvml
    except ImportError as err:  # nvidia-ml-py is a dependency, but a bare node may lack it
        return {"ok": False, "reason": f"nvidia-ml-py is not installed ({err})", "devices": []}
    try:
        pynvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return {"ok": False, "reason": f"NVML unavailable: {_nvml_error_text(err)}", "devices": []}
    try:
        reading: NvmlReading = {"ok": True, "reason": "", "devices": []}
        reading["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        try:
            reading["cuda_driver_version"] = int(pynvml.nvmlSystemGetCudaDriverVersion())
        except pynvml.NVMLError:
            reading["cuda_driver_version"] = 0
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            dev: dict[str, Any] = {
                "index": i,
                "name": _text(pynvml.nvmlDeviceGetName(h)),
                "memory_total": int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
            }
            try:
                dev["uuid"] = _text(pynvml.nvmlDeviceGetUUID(h))
                dev["pci_bus_id"] = _text(pynvml.nvmlDeviceGetPciInfo(h).busId)
            except pynvml.NVMLError:
                pass  # older drivers: the device is still listed, without its identity
            reading["devices"].append(dev)
        return reading
    except Exception as err:  # noqa: BLE001 - any NVML failure is a finding, not a crash
        return {"ok": False, "reason": f"NVML query failed: {_nvml_error_text(err)}", "devices": []}
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _nvml_error_text(err: Exception) -> str:
    return str(err) or type(err).__name__


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def gpus_from_nvml(reading: NvmlReading) -> tuple[tuple[GpuInfo, ...], str, str, str]:
    """(gpus, reason when there are none, driver version, CUDA version as "12.4")."""
    if not reading.get("ok"):
        return (), str(reading.get("reason") or "NVML unavailable"), "", ""
    gpus = tuple(
        GpuInfo(
            index=int(d["index"]),
            name=str(d["name"]),
            memory_total_mb=int(d["memory_total"]) // (1024 * 1024),
            uuid=str(d.get("uuid", "")),
            pci_bus_id=str(d.get("pci_bus_id", "")),
        )
        for d in reading.get("devices", ())
    )
    cuda = int(reading.get("cuda_driver_version") or 0)
    # NVML encodes CUDA 12.4 as 12040 (major*1000 + minor*10).
    cuda_text = f"{cuda // 1000}.{(cuda % 1000) // 10}" if cuda else ""
    reason = "" if gpus else "NVML found no GPU"
    return gpus, reason, str(reading.get("driver_version", "")), cuda_text


def resolve_visible_devices(
    value: str | None, gpus: tuple[GpuInfo, ...]
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Which physical GPUs CUDA_VISIBLE_DEVICES leaves visible, and the entries that name none.

    CUDA reads the list in order and stops at the first entry it cannot match (an ordinal beyond
    the count, an unknown UUID, a repeat): that entry and everything after it are ignored, which is
    how "8 GPUs requested, 4 seen" happens. Those entries are returned so preflight can name them.
    """
    if value is None:
        return tuple(g.index for g in gpus), ()
    entries = [e.strip() for e in value.split(",")] if value.strip() else []
    count = len(gpus)
    visible: list[int] = []
    for pos, entry in enumerate(entries):
        index = _match_visible_entry(entry, gpus, count)
        if index is None or index in visible:
            return tuple(visible), tuple(entries[pos:])
        visible.append(index)
    return tuple(visible), ()


def _match_visible_entry(entry: str, gpus: tuple[GpuInfo, ...], count: int) -> int | None:
    if re.fullmatch(r"\d+", entry):
        i = int(entry)
        return i if i < count else None
    if entry.startswith(("GPU-", "MIG-")):
        # CUDA accepts a unique prefix of the UUID.
        matches = [g.index for g in gpus if g.uuid and g.uuid.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    return None


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def torch_cuda_version() -> str | None:
    """torch.version.cuda without importing torch (seconds of CPU per node): read torch/version.py."""
    spec = util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        version_py = Path(loc) / "version.py"
        if version_py.is_file():
            m = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", version_py.read_text(), re.MULTILINE)
            return m.group(1) if m else None
    return None


def nccl_version(torch_version: str | None, cuda: str | None) -> tuple[str | None, str]:
    """The NCCL torch loads, and why there is none. Pip builds of torch load the nvidia-nccl wheel."""
    if torch_version is None:
        return None, "torch is not installed"
    if cuda is None:
        return None, "torch is a CPU-only build (no NCCL)"
    for wheel in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
        v = package_version(wheel)
        if v:
            return v, ""
    # A conda or source build links NCCL in: only torch itself can say which.
    try:
        import torch

        v = torch.cuda.nccl.version()
        return (".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)), ""
    except Exception as err:  # noqa: BLE001 - a broken CUDA install is reported, not raised
        return None, f"torch could not report its NCCL version ({err})"


def describe_path(label: str, path: str) -> PathInfo:
    p = Path(path).expanduser()
    exists = p.exists()
    # Free space of the filesystem the path is (or will be) on: the nearest existing parent.
    probe_at = p
    while not probe_at.exists() and probe_at != probe_at.parent:
        probe_at = probe_at.parent
    free = total = None
    try:
        usage = shutil.disk_usage(probe_at)
        free, total = usage.free / 1e9, usage.total / 1e9
    except OSError:
        pass
    readable = exists and os.access(p, os.R_OK)
    if readable and p.is_dir():
        try:  # a directory with r but no x cannot be listed usefully
            next(iter(os.scandir(p)), None)
        except OSError:
            readable = False
    # a runs path under a file (--runs FILE/x) is not writable, though the file itself may be
    writable = os.access(p if exists else probe_at, os.W_OK) and (exists or probe_at.is_dir())
    return PathInfo(
        label=label,
        path=str(p),
        exists=exists,
        readable=readable,
        writable=writable,
        is_dir=p.is_dir(),
        free_gb=free,
        total_gb=total,
        fs_path=str(probe_at),
    )


def network_interfaces() -> tuple[NetInterface, ...]:
    stats = psutil.net_if_stats()
    out = []
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        ips = tuple(a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))
        out.append(NetInterface(name=name, addresses=ips, is_up=bool(stats.get(name) and stats[name].isup)))
    return tuple(out)


def infiniband_devices(sys_root: str = "/sys") -> tuple[str, ...]:
    try:
        return tuple(sorted(os.listdir(os.path.join(sys_root, "class", "infiniband"))))
    except OSError:
        return ()


def probe_node(
    paths: Mapping[str, str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    nvml: Callable[[], NvmlReading] = read_nvml,
    sys_root: str = "/sys",
) -> NodeFacts:
    """Facts of this machine. `paths` maps labels ("runs", "data") to paths to check."""
    t0 = time.monotonic()
    env = os.environ if env is None else env

    gpus, reason, driver, cuda = gpus_from_nvml(nvml())
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    visible, invalid = resolve_visible_devices(cvd, gpus)
    if gpus and not visible:
        reason = f"CUDA_VISIBLE_DEVICES={cvd!r} hides every GPU"
    interfaces = network_interfaces()
    torch_v = package_version("torch")
    torch_cuda = torch_cuda_version() if torch_v else None
    nccl, nccl_reason = nccl_version(torch_v, torch_cuda)
    try:
        cpus = len(os.sched_getaffinity(0))  # what this process may use, not what the board has
    except AttributeError:
        cpus = os.cpu_count() or 0
    facts = NodeFacts(
        hostname=socket.gethostname(),
        boot_id=boot_id(),
        addresses=tuple(a for i in interfaces if i.is_up and i.name != "lo" for a in i.addresses),
        gpus=gpus,
        gpu_reason=reason,
        driver_version=driver,
        cuda_driver_version=cuda,
        cuda_visible_devices=cvd,
        visible_gpu_indices=visible,
        invalid_visible_entries=invalid,
        cpu_count=cpus,
        ram_gb=round(psutil.virtual_memory().total / 1e9, 2),
        paths=tuple(describe_path(label, p) for label, p in (paths or {}).items()),
        python_version=".".join(str(x) for x in sys.version_info[:3]),
        python_executable=sys.executable,
        torch_version=torch_v,
        torch_cuda_version=torch_cuda,
        nccl_version=nccl,
        nccl_reason=nccl_reason,
        deepspeed_version=package_version("deepspeed"),
        accelerate_version=package_version("accelerate"),
        taehv_console_version=package_version("taehv-console"),
        ib_devices=infiniband_devices(sys_root),
        interfaces=interfaces,
        comm_env=tuple(sorted((k, v) for k, v in env.items() if k.startswith(COMM_ENV_PREFIXES))),
        probe_seconds=round(time.monotonic() - t0, 4),
        # Taken last so the console can bound the clock offset by the round trip.
        clock=time.time(),
    )
    return facts


def parse_path_args(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"--path expects LABEL=PATH, got {item!r}")
        out[label] = path
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m taehv_console.core.cluster.probe",
        description="Print this node's facts as one JSON object.",
    )
    parser.add_argument(
        "--path",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="a path to check (existence, access, free space); repeatable",
    )
    args = parser.parse_args(argv)
    facts = probe_node(parse_path_args(args.path))
    json.dump(facts.to_dict(), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
