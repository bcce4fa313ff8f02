"""Per-node agent: prints one JSON object per interval with what changes on the node (per-GPU
utilisation, memory, temperature, power, the run's processes; CPU, RAM, disk, network), and the
console-side parser that turns such a line into a NodeSample.

    python -m taehv_console.core.watch.agent [--interval 1] [--run RUN_DIR] [--disk PATH]...

It exits when its stdin closes (the console holds the other end of the pipe or SSH channel), so it
never outlives the console. No GPU or no NVML gives a CPU-only sample with gpu.ok = false. It never
imports torch: it runs on every node every second.

The GPU part of a line is the raw NVML reading (`read` of NvmlSampler); all decisions are made on
the console from it (`gpu_samples`), so they are tested on recorded readings.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil

from taehv_console.core.watch.state import DiskSample, GpuSample, NodeSample, ProcessSample

AGENT_VERSION = 1
MB = 1024 * 1024

# Clock-event reasons that mean the GPU runs slower than it could. GPU idle, application clocks and
# sync boost are not problems; the software power cap is routine at full load on SXM boards.
THROTTLE_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}
SLOWDOWN_REASONS = frozenset({"hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"})


# ------------------------------------------------------------------------------------------- NVML


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlSampler:
    """NVML opened once for the agent's life; `read()` returns plain data (the recorded-sample shape):

    {"ok": bool, "reason": str, "driver_version": str,
     "devices": [{"index", "name", "uuid", "utilization": {"gpu", "memory"} (%),
                  "memory": {"used", "total"} (bytes), "temperature" (C), "power_usage_mw",
                  "power_limit_mw", "clocks_event_reasons" (bitmask),
                  "processes": [{"pid", "used_memory" (bytes or null)}],
                  "errors": {field: NVML message}, "error": message when the device failed}]}
    """

    def __init__(self, nvml: Any = None):
        self._nvml = nvml
        self._handles: list[Any] = []
        self.reason = ""
        self.driver_version = ""
        if self._nvml is None:
            try:
                import pynvml

                self._nvml = pynvml
            except ImportError as err:  # a dependency, but a bare node may lack it
                self.reason = f"nvidia-ml-py is not installed ({err})"
                return
        try:
            self._nvml.nvmlInit()
        except Exception as err:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.reason = f"NVML unavailable: {str(err) or type(err).__name__}"
            self._nvml = None
            return
        try:
            self.driver_version = _text(self._nvml.nvmlSystemGetDriverVersion())
            self._handles = [
                self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._nvml.nvmlDeviceGetCount())
            ]
        except Exception as err:  # noqa: BLE001 - any NVML failure: a CPU-only sample with the reason
            self.reason = f"NVML query failed: {str(err) or type(err).__name__}"
            self.close()
        if self._nvml is not None and not self._handles:
            self.reason = "NVML found no GPU"

    @property
    def ok(self) -> bool:
        return self._nvml is not None and bool(self._handles)

    def read(self) -> dict[str, Any]:
        if not self.ok:
            return {"ok": False, "reason": self.reason, "devices": []}
        return {
            "ok": True,
            "reason": "",
            "driver_version": self.driver_version,
            "devices": [self._device(i, h) for i, h in enumerate(self._handles)],
        }

    def _device(self, index: int, h: Any) -> dict[str, Any]:
        nv = self._nvml
        dev: dict[str, Any] = {"index": index}
        errors: dict[str, str] = {}

        def field(name: str, fn: Callable[[], Any]) -> None:
            try:
                dev[name] = fn()
            except Exception as err:  # noqa: BLE001 - NotSupported on some boards; GpuIsLost off the bus
                errors[name] = str(err) or type(err).__name__

        field("name", lambda: _text(nv.nvmlDeviceGetName(h)))
        field("uuid", lambda: _text(nv.nvmlDeviceGetUUID(h)))
        field("utilization", lambda: _util(nv.nvmlDeviceGetUtilizationRates(h)))
        field("memory", lambda: _mem(nv.nvmlDeviceGetMemoryInfo(h)))
        field("temperature", lambda: int(nv.nvmlDeviceGetTemperature(h, 0)))  # 0 = NVML_TEMPERATURE_GPU
        field("power_usage_mw", lambda: int(nv.nvmlDeviceGetPowerUsage(h)))
        field("power_limit_mw", lambda: int(nv.nvmlDeviceGetEnforcedPowerLimit(h)))
        field("clocks_event_reasons", lambda: int(_clock_reasons(nv, h)))
        field(
            "processes",
            lambda: [
                {"pid": int(p.pid), "used_memory": _proc_mem(p)}
                for p in nv.nvmlDeviceGetComputeRunningProcesses(h)
            ],
        )
        if errors:
            dev["errors"] = errors
            lost = [m for m in errors.values() if "lost" in m.lower() or "reset" in m.lower()]
            if lost or len(errors) >= 8:  # nothing answered: the device itself is gone
                dev["error"] = lost[0] if lost else next(iter(errors.values()))
        return dev

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001, S110 - shutting down a library that failed: nothing to do
                pass
        self._nvml = None
        self._handles = []


def _util(u: Any) -> dict[str, int]:
    return {"gpu": int(u.gpu), "memory": int(u.memory)}


def _mem(m: Any) -> dict[str, int]:
    return {"used": int(m.used), "total": int(m.total)}


def _clock_reasons(nv: Any, h: Any) -> int:
    # NVML renamed "throttle reasons" to "clock event reasons" (driver 535); older bindings lack it.
    fn = (
        getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    return fn(h)


def _proc_mem(p: Any) -> int | None:
    used = getattr(p, "usedGpuMemory", None)
    # NVML reports "not available" (e.g. without permission in a container) as a huge sentinel.
    return int(used) if isinstance(used, int) and used < (1 << 60) else None


# ------------------------------------------------------------------------------- host and processes


class RunProcesses:
    """pid -> rank of this run's processes on this node, from the heartbeat files (host == ours).

    The file names do not say the host, so finding this node's ranks from the files means reading
    every heartbeat, on shared storage: 256 agents reading 2,048 files every 10 s would be 52,000
    reads a second. So the node's ranks come first from its process table: the run's workers
    (`trainer.cli --run RUN`) carry RANK, LOCAL_RANK and LOCAL_WORLD_SIZE in their environments
    (torchrun sets them), and once all LOCAL_WORLD_SIZE of them are there, only their files are
    read, from start-up on (a file not written yet, or left by an earlier placement, gives no pid
    while the table still says the rank is here; when a worker is gone, the table is looked at
    again for relaunched workers holding other ranks). Where the table does not say (workers not
    started yet, another launcher), every file is read until as many ranks as a found rank's
    LOCAL_WORLD_SIZE are found (without it, every read stays a full one), and a file of those
    that is missing or names another host (the rank moved) starts the search again. Reads come
    every `refresh_s` while the pids are known, every `search_s` while none is, and at once when a
    known pid is gone (a relaunch writes new pids)."""

    def __init__(self, run_dir: str | None, hostname: str, refresh_s: float = 10.0, search_s: float = 2.0):
        self.dir = Path(run_dir) / "heartbeat" if run_dir else None
        self.hostname = hostname
        self.refresh_s = refresh_s
        self.search_s = search_s
        self._pids: dict[int, int] = {}
        self._own: tuple[int, ...] = ()  # this node's ranks, once all are known
        self._by_table = False  # whether the process table said them (not the files)
        self._table_at = -1e18
        self._table_ranks: tuple[int, ...] = ()
        self._read_at = -1e18

    def current(self, now: float, gone: bool = False) -> dict[int, int]:
        every = self.refresh_s if self._pids else self.search_s
        if self.dir is not None and (gone or now - self._read_at >= every):
            self._read_at = now
            pids = self._own_pids(now, gone) if self._own else None
            self._pids = self._search(now) if pids is None else pids
        return self._pids

    def _own_pids(self, now: float, gone: bool) -> dict[int, int] | None:
        """pid -> rank from this node's own files; None when its ranks must be found again."""
        # a worker is gone: relaunched workers may hold other ranks while the old files still name
        # this host (at most every refresh_s; a failed run's dead pids that nothing replaces leave
        # the table empty and bring no full reads)
        recheck = gone and self._by_table and now - self._table_at >= self.refresh_s
        if recheck and self._table(now) not in ((), self._own):
            return None
        pids, elsewhere = self._read(self._files(self._own))
        # not written yet, stale from an earlier placement, or the ranks moved: keep them only
        # while this node's process table still says they are ours
        if (elsewhere or len(pids) < len(self._own)) and self._table(now) != self._own:
            return None
        return pids

    def _search(self, now: float) -> dict[int, int]:
        """This node's ranks from the process table, else from every file (see the class doc)."""
        self._own = self._table(now)
        self._by_table = bool(self._own)
        if self._own:
            return self._read(self._files(self._own))[0]
        try:
            paths = [Path(e.path) for e in os.scandir(self.dir)]
        except OSError:
            paths = []
        pids, _ = self._read(paths)
        if pids and _local_world_size(pids) == len(pids):
            self._own = tuple(sorted(pids.values()))
        return pids

    def _table(self, now: float) -> tuple[int, ...]:
        """_workers_ranks, looked at once per read (`now`)."""
        assert self.dir is not None  # current() reads only with a run directory
        if self._table_at != now:
            self._table_at, self._table_ranks = now, _workers_ranks(self.dir.parent)
        return self._table_ranks

    def _files(self, ranks: tuple[int, ...]) -> list[Path]:
        assert self.dir is not None  # current() reads only with a run directory
        return [self.dir / f"rank-{r}.json" for r in ranks]

    def _read(self, paths: list[Path]) -> tuple[dict[int, int], bool]:
        """(pid -> rank of the files naming this host, whether any file names another host)."""
        pids: dict[int, int] = {}
        elsewhere = False
        for path in paths:
            name = path.name
            if not (name.startswith("rank-") and name.endswith(".json")):
                continue
            try:
                beat = json.loads(path.read_text())
                rank = int(name[5:-5])
            except (OSError, ValueError):
                continue  # not written yet, or being replaced right now; the next read has it
            if beat.get("host") != self.hostname:
                elsewhere = True
            elif isinstance(beat.get("pid"), int):
                pids[beat["pid"]] = rank
        return pids, elsewhere


def _workers_ranks(run_dir: Path) -> tuple[int, ...]:
    """This node's ranks of the run, from the process table alone (no shared-storage reads): the
    processes running `trainer.cli --run RUN_DIR` with RANK, LOCAL_RANK and LOCAL_WORLD_SIZE in
    their environments. () unless all LOCAL_WORLD_SIZE of them are found (the launcher itself has
    no LOCAL_RANK; a stray RANK in a platform's pod environment makes the count disagree)."""
    want = os.path.realpath(run_dir)
    ranks: set[int] = set()
    sizes: set[int] = set()
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "trainer.cli" not in cmd or "--run" not in cmd[:-1]:
            continue
        try:
            where = os.path.join(proc.cwd(), cmd[cmd.index("--run") + 1])
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        found = [env.get(k, "") for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")]
        if os.path.realpath(where) == want and all(v.isdigit() for v in found):
            ranks.add(int(found[0]))
            sizes.add(int(found[2]))
    return tuple(sorted(ranks)) if len(sizes) == 1 and len(ranks) == sizes.pop() else ()


def _local_world_size(pids: Mapping[int, int]) -> int | None:
    """How many ranks this node runs, from LOCAL_WORLD_SIZE in one of their environments (set by
    torchrun for each worker); None when no environment says."""
    for pid in pids:
        try:
            value = psutil.Process(pid).environ().get("LOCAL_WORLD_SIZE")
        except (psutil.Error, OSError):
            continue
        if value and value.isdigit():
            return int(value)
    return None


class HostSampler:
    """psutil readings; CPU percentages are since the previous call, so the first one is primed."""

    def __init__(self, disks: list[str]):
        self.psutil = psutil
        self.disks = disks
        psutil.cpu_percent(None)
        self._net = psutil.net_io_counters()
        self._net_t = time.monotonic()
        self._procs: dict[int, Any] = {}

    def read(self) -> dict[str, Any]:
        ps = self.psutil
        mem = ps.virtual_memory()
        out: dict[str, Any] = {
            "cpu_pct": ps.cpu_percent(None),
            "cpu_count": ps.cpu_count() or 0,
            "load1": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "ram_used_gb": round((mem.total - mem.available) / 2**30, 3),
            "ram_total_gb": round(mem.total / 2**30, 3),
            "disks": [],
        }
        for path in self.disks:
            try:
                du = ps.disk_usage(path)
            except OSError:
                continue
            out["disks"].append(
                {
                    "path": path,
                    "used_gb": round(du.used / 2**30, 3),
                    "total_gb": round(du.total / 2**30, 3),
                    "free_gb": round(du.free / 2**30, 3),
                }
            )
        net, t = ps.net_io_counters(), time.monotonic()
        dt = max(t - self._net_t, 1e-6)
        out["net_rx_mbps"] = round((net.bytes_recv - self._net.bytes_recv) * 8 / dt / 1e6, 3)
        out["net_tx_mbps"] = round((net.bytes_sent - self._net.bytes_sent) * 8 / dt / 1e6, 3)
        self._net, self._net_t = net, t
        return out

    def processes(self, pids: Mapping[int, int]) -> tuple[list[dict[str, Any]], dict[int, int], bool]:
        """(per-process dicts, pid -> rank including children (GPU memory is held by the rank or
        its workers), whether a known pid is gone)."""
        ps = self.psutil
        rows, owners, gone = [], {}, False
        for pid in list(self._procs):
            if pid not in pids:
                del self._procs[pid]
        for pid, rank in sorted(pids.items()):
            row: dict[str, Any] = {"pid": pid, "rank": rank, "status": "gone"}
            try:
                proc = self._procs.get(pid)
                if proc is None:
                    proc = self._procs[pid] = ps.Process(pid)
                    proc.cpu_percent(None)  # prime; the next sample has a real value
                    cpu = None
                else:
                    cpu = proc.cpu_percent(None)
                with proc.oneshot():
                    row["status"] = proc.status()
                    row["rss_mb"] = round(proc.memory_info().rss / MB, 1)
                row["cpu_pct"] = cpu
                owners[pid] = rank
                for child in proc.children(recursive=True):
                    owners[child.pid] = rank
            except (ps.NoSuchProcess, ps.AccessDenied, ps.ZombieProcess) as err:
                self._procs.pop(pid, None)
                row["status"] = "zombie" if isinstance(err, ps.ZombieProcess) else "gone"
                gone = True
            rows.append(row)
        return rows, owners, gone


# ------------------------------------------------------------------------------------------ sample


class Agent:
    def __init__(
        self,
        *,
        run_dir: str | None,
        disks: list[str],
        interval: float,
        hostname: str | None = None,
        nvml: Any = None,
        replay: list[dict] | None = None,
        use_nvml: bool = True,
    ):
        self.hostname = hostname or socket.gethostname()
        self.interval = interval
        self.replay = replay
        self.nvml = None if (replay is not None or not use_nvml) else NvmlSampler(nvml)
        self.host = HostSampler(disks)
        self.procs = RunProcesses(run_dir, self.hostname)
        self.seq = 0
        self._gone = False

    def sample(self) -> dict[str, Any]:
        now = time.time()
        if self.replay is not None:
            gpu = self.replay[self.seq % len(self.replay)]
        elif self.nvml is not None:
            gpu = self.nvml.read()
        else:
            gpu = {"ok": False, "reason": "NVML disabled (--no-nvml)", "devices": []}
        pids = self.procs.current(time.monotonic(), gone=self._gone)
        rows, owners, self._gone = self.host.processes(pids)
        line = {
            "v": AGENT_VERSION,
            "host": self.hostname,
            "time": now,
            "seq": self.seq,
            "interval_s": self.interval,
            "agent_pid": os.getpid(),
            "nvml": gpu,
            **self.host.read(),
            "processes": rows,
            "owners": {str(k): v for k, v in owners.items()},
        }
        self.seq += 1
        return line

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.close()


def _stdin_closed(fd: int, timeout: float) -> bool:
    """Wait up to `timeout` for stdin; True once it reached EOF (the console went away)."""
    try:
        ready, _, _ = select.select([fd], [], [], max(timeout, 0.0))
    except (OSError, ValueError):
        return True
    if not ready:
        return False
    try:
        return os.read(fd, 65536) == b""
    except OSError:
        return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m taehv_console.core.watch.agent",
        description="Print one JSON sample of this node per interval until stdin closes.",
    )
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    ap.add_argument("--run", help="run directory: its heartbeats name this node's training processes")
    ap.add_argument("--disk", action="append", default=[], help="path whose filesystem usage to report")
    ap.add_argument(
        "--count", type=int, default=0, help="stop after this many samples (0 = until stdin closes)"
    )
    ap.add_argument("--no-nvml", action="store_true", help="report no GPUs (a CPU-only sample)")
    ap.add_argument(
        "--replay", help="JSON file of recorded NVML readings to report instead of NVML (demos, benchmarks)"
    )
    ap.add_argument("--host-name", help="host name to report (synthetic nodes)")
    args = ap.parse_args(argv)
    if args.interval <= 0:
        ap.error("--interval must be positive")
    replay = None
    if args.replay:
        data = json.loads(Path(args.replay).read_text())
        replay = data if isinstance(data, list) else [data]
    disks = args.disk or ([args.run] if args.run else [])
    agent = Agent(
        run_dir=args.run,
        disks=disks,
        interval=args.interval,
        hostname=args.host_name,
        replay=replay,
        use_nvml=not args.no_nvml,
    )
    # A bounded run (--count) ends by itself: its stdin may be closed from the start (runner.run).
    stdin_fd = sys.stdin.fileno() if (sys.stdin is not None and not args.count) else -1
    out = sys.stdout
    try:
        if args.count:
            time.sleep(min(0.25, args.interval))  # a one-shot sample needs a CPU window to mean anything
        next_due = time.monotonic()
        while True:
            try:
                out.write(json.dumps(agent.sample(), separators=(",", ":")) + "\n")
                out.flush()
            except BrokenPipeError:
                return 0
            if args.count and agent.seq >= args.count:
                return 0
            next_due += args.interval
            now = time.monotonic()
            next_due = max(next_due, now)  # fell behind (suspended, overloaded): do not burst to catch up
            if stdin_fd < 0:
                time.sleep(next_due - now)
            elif _stdin_closed(stdin_fd, next_due - now):
                return 0
    except KeyboardInterrupt:
        return 0
    finally:
        agent.close()


# ------------------------------------------------------------------------------ console-side parse


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
            )
        )
    return tuple(out)


def _num(v: Any) -> float | None:
    return float(v) if type(v) in _NUM else None


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
    )


if __name__ == "__main__":
    sys.exit(main())
