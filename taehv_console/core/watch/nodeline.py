"""The console's side of the agent's line: `parse_sample` turns one JSON line of the per-node agent
(core/watch/agent.py) into a NodeSample, and `gpu_samples` its raw NVML reading into GpuSamples.
All GPU decisions are made here, on the console, so they are tested on recorded readings.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from taehv_console.core.watch.nodesample import DiskSample, GpuSample, NodeSample, ProcessSample, XidEvent
from taehv_console.core.watch.nvml import MB, THROTTLE_REASONS

_THROTTLE_ITEMS = tuple(sorted(THROTTLE_REASONS.items()))
_NUM = (int, float)


def gpu_samples(reading: Mapping[str, Any], owners: Mapping[int, int] | None = None) -> tuple[GpuSample, ...]:
    """GpuSample per device of a raw NVML reading; `owners` (pid -> rank) picks the run's processes.
    On the console's hot path (64 nodes x 8 GPUs a second): plain type checks, no helpers per field."""
    owners = owners or {}
    out: list[GpuSample] = []
    if not reading.get("ok"):
        return ()
    for d in reading.get("devices", ()):
        util: Any = d.get("utilization") or {}  # JSON: the checks below look at each value
        mem: Any = d.get("memory") or {}
        run_mem, run_pids = 0.0, []
        for p in d.get("processes") or ():
            if p.get("pid") in owners:
                run_pids.append(int(p["pid"]))
                run_mem += (p.get("used_memory") or 0) / MB
        bits = d.get("clocks_event_reasons") or 0
        gu, mu, used, total = util.get("gpu"), util.get("memory"), mem.get("used"), mem.get("total")
        temp, pw, pl = d.get("temperature"), d.get("power_usage_mw"), d.get("power_limit_mw")
        ecc = d.get("ecc_uncorrected_volatile")  # absent from older agents' lines
        out.append(
            GpuSample(
                index=int(d.get("index", len(out))),
                name=str(d.get("name", "")),
                uuid=str(d.get("uuid", "")),
                util_pct=float(gu) if type(gu) in _NUM else None,
                mem_util_pct=float(mu) if type(mu) in _NUM else None,
                mem_used_mb=used / MB if type(used) in _NUM else None,
                mem_total_mb=total / MB if type(total) in _NUM else None,
                temp_c=float(temp) if type(temp) in _NUM else None,
                power_w=pw / 1000 if type(pw) in _NUM else None,
                power_limit_w=pl / 1000 if type(pl) in _NUM else None,
                run_mem_mb=round(run_mem, 1),
                run_pids=tuple(run_pids),
                throttle=tuple(name for bit, name in _THROTTLE_ITEMS if bits & bit) if bits else (),
                error=str(d.get("error", "")),
                ecc_uncorrected=ecc if type(ecc) is int else None,
            )
        )
    return tuple(out)


def _num(v: object) -> float | None:
    # exactly int or float, as JSON numbers load (not bool, which isinstance takes for an int)
    return float(v) if isinstance(v, (int, float)) and type(v) in _NUM else None


def parse_sample(data: str | bytes | Mapping[str, Any], received: float | None = None) -> NodeSample:
    """A NodeSample from one agent line. Raises ValueError on a line that is not an agent sample."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as err:
            raise ValueError(f"not an agent sample: {err}") from None
    if not isinstance(data, Mapping) or "host" not in data or "time" not in data:
        raise ValueError("not an agent sample: no host/time")
    owners = {int(k): v for k, v in (data.get("owners") or {}).items()}
    reading = data.get("nvml") or {"ok": False, "reason": "no NVML reading", "devices": []}
    gpus = gpu_samples(reading, owners)
    gpu_mem: dict[int, float] = {}
    for dev in reading.get("devices", ()) if reading.get("ok") else ():
        for p in dev.get("processes") or ():
            rank_pid = p.get("pid")
            if rank_pid in owners:
                gpu_mem[owners[rank_pid]] = (
                    gpu_mem.get(owners[rank_pid], 0.0) + (p.get("used_memory") or 0) / MB
                )
    procs = tuple(
        ProcessSample(
            pid=int(p["pid"]),
            rank=p.get("rank"),
            status=str(p.get("status", "gone")),
            cpu_pct=_num(p.get("cpu_pct")),
            rss_mb=_num(p.get("rss_mb")),
            gpu_mem_mb=round(gpu_mem.get(p.get("rank"), 0.0), 1),
        )
        for p in data.get("processes") or ()
    )
    xids, xid_reason = _xids(data)
    return NodeSample(
        host=str(data["host"]),
        time=float(data["time"]),
        seq=int(data.get("seq", 0)),
        interval_s=float(data.get("interval_s", 1.0)),
        gpu_ok=bool(reading.get("ok")) and bool(gpus),
        gpu_reason="" if (reading.get("ok") and gpus) else str(reading.get("reason") or "NVML found no GPU"),
        gpus=gpus,
        cpu_pct=_num(data.get("cpu_pct")),
        cpu_count=int(data.get("cpu_count") or 0),
        load1=_num(data.get("load1")),
        ram_used_gb=_num(data.get("ram_used_gb")),
        ram_total_gb=_num(data.get("ram_total_gb")),
        disks=tuple(
            DiskSample(str(d["path"]), float(d["used_gb"]), float(d["total_gb"]), float(d["free_gb"]))
            for d in data.get("disks") or ()
        ),
        net_rx_mbps=_num(data.get("net_rx_mbps")),
        net_tx_mbps=_num(data.get("net_tx_mbps")),
        processes=procs,
        agent_pid=int(data.get("agent_pid") or 0),
        received=time.time() if received is None else received,
        xids=xids,
        xid_reason=xid_reason,
    )


def _xids(data: Mapping[str, Any]) -> tuple[tuple[XidEvent, ...], str]:
    """The agent line's Xid events and why its kernel log is not read (absent from older agents'
    lines: none, and no reason)."""
    d = data.get("xid")
    if not isinstance(d, Mapping):
        return (), ""
    events = tuple(
        XidEvent(code=int(p["code"]), pci=str(p.get("pci", "")), text=str(p.get("text", "")))
        for p in d.get("events") or ()
        if isinstance(p, Mapping) and type(p.get("code")) is int
    )
    return events, str(d.get("reason") or "")
