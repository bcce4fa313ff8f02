"""NVML on a node: the agent's GPU reading (`NvmlSampler.read`), plain data in the recorded-sample
shape, and the clock-event reasons the console judges it by. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlSampler:
    """NVML opened once for the agent's life; `read()` returns plain data (the recorded-sample shape):

    {"ok": bool, "reason": str, "driver_version": str,
     "devices": [{"index", "name", "uuid", "utilization": {"gpu", "memory"} (%),
                  "memory": {"used", "total"} (bytes), "temperature" (C), "power_usage_mw",
                  "power_limit_mw", "clocks_event_reasons" (bitmask),
                  "processes": [{"pid", "used_memory" (bytes or null)}],
                  "ecc_uncorrected_volatile" (count; absent where the board has no ECC or it is off),
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

    def _device(self, index: int, h: object) -> dict[str, Any]:
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
        # Uncorrectable ECC errors since the driver loaded: above zero, the GPU's memory is bad
        # (the console leaves the node out). A board without ECC, or with it off, answers
        # NotSupported: that is the board, not a fault, so the field is left out and no error kept.
        # 1, 0 = NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
        try:
            dev["ecc_uncorrected_volatile"] = int(nv.nvmlDeviceGetTotalEccErrors(h, 1, 0))
        except Exception as err:  # noqa: BLE001 - NotSupported without ECC; GpuIsLost off the bus
            if not _not_supported(err):
                errors["ecc_uncorrected_volatile"] = str(err) or type(err).__name__
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


def _not_supported(err: Exception) -> bool:
    # pynvml's NVMLError_NotSupported carries value 3 (NVML_ERROR_NOT_SUPPORTED); its text is NVML's
    return getattr(err, "value", None) == 3 or str(err) == "Not Supported"


def _util(u: Any) -> dict[str, int]:
    return {"gpu": int(u.gpu), "memory": int(u.memory)}


def _mem(m: Any) -> dict[str, int]:
    return {"used": int(m.used), "total": int(m.total)}


def _clock_reasons(nv: Any, h: object) -> int:
    # NVML renamed "throttle reasons" to "clock event reasons" (driver 535); older bindings lack it.
    fn = (
        getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
        or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    return fn(h)


def _proc_mem(p: object) -> int | None:
    used = getattr(p, "usedGpuMemory", None)
    # NVML reports "not available" (e.g. without permission in a container) as a huge sentinel.
    return int(used) if isinstance(used, int) and used < (1 << 60) else None
