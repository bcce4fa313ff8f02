"""Checks of each node's software and settings: packages present and alike on every node, NCCL
and gloo settings against the node's network hardware, and clocks that agree."""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence

from taehv_console.core.cluster.preflight.findings import E, W
from taehv_console.core.models import Finding, NodeFacts, ProbeResult, Severity
from trainer.config import OptimSection

CLOCK_SKEW_LIMIT_S = 2.0

# (field, label, severity when nodes disagree). Python compares major.minor: a patch release
# does not change pickles or the C ABI of the installed wheels.
_VERSION_FIELDS: tuple[tuple[str, str, Severity], ...] = (
    ("python_minor", "Python", E),
    ("torch_version", "torch", E),
    ("deepspeed_version", "deepspeed", E),
    ("accelerate_version", "accelerate", E),
    ("nccl_version", "NCCL", E),
    ("driver_version", "NVIDIA driver", W),
    ("cuda_driver_version", "CUDA (driver)", W),
)


def check_version_skew(facts: Mapping[str, NodeFacts], device: str = "cuda") -> list[Finding]:
    out = []
    for host, f in facts.items():
        for attr, label in (
            ("torch_version", "torch"),
            ("deepspeed_version", "deepspeed"),
            ("accelerate_version", "accelerate"),
        ):
            if getattr(f, attr) is None:
                out.append(
                    Finding(
                        "package-missing",
                        E,
                        f"{host}: {label} is not installed for {f.python_executable}",
                        f"install the project's environment on {host} (make install)",
                        host,
                    )
                )
    if len(facts) < 2:
        return out
    for attr, label, sev in _VERSION_FIELDS:
        if device == "cpu" and attr in ("nccl_version", "driver_version", "cuda_driver_version"):
            continue
        values: dict[str, list[str]] = {}
        for host, f in facts.items():
            v = ".".join(f.python_version.split(".")[:2]) if attr == "python_minor" else getattr(f, attr)
            if v:
                values.setdefault(str(v), []).append(host)
        if len(values) > 1:
            desc = "; ".join(f"{v} on {', '.join(h)}" for v, h in sorted(values.items()))
            out.append(
                Finding(
                    "version-skew",
                    sev,
                    f"{label} differs across nodes: {desc}",
                    f"install one {label} version on every node",
                )
            )
    return out


def _nccl_list(value: str) -> tuple[bool, bool, list[str]]:
    """NCCL's interface/HCA list syntax: '^' excludes, '=' matches exactly, else prefix match."""
    exclude = value.startswith("^")
    value = value[1:] if exclude else value
    exact = value.startswith("=")
    value = value[1:] if exact else value
    return exclude, exact, [v.split(":")[0] for v in value.split(",") if v]


def check_nccl_env(
    facts: Mapping[str, NodeFacts], nccl_env: Mapping[str, str], device: str = "cuda"
) -> list[Finding]:
    """The NCCL settings a launch will use (the node's own env, overridden by the config's
    distributed.nccl_env) against the node's InfiniBand devices and network interfaces."""
    out = []
    for host, f in facts.items():
        env = {**dict(f.comm_env), **nccl_env}
        ifaces = [i.name for i in f.interfaces]
        ib = list(f.ib_devices)
        if device == "cuda" and not ib:
            if env.get("NCCL_NET", "").upper() == "IB":
                out.append(
                    Finding(
                        "nccl-ib-missing",
                        E,
                        f"{host}: NCCL_NET=IB but the node has no InfiniBand devices (/sys/class/infiniband is empty)",
                        "unset NCCL_NET or run on nodes with InfiniBand",
                        host,
                    )
                )
            elif env.get("NCCL_IB_DISABLE") == "0" or env.get("NCCL_IB_HCA"):
                what = "NCCL_IB_HCA=" + env["NCCL_IB_HCA"] if env.get("NCCL_IB_HCA") else "NCCL_IB_DISABLE=0"
                out.append(
                    Finding(
                        "nccl-ib-missing",
                        W,
                        f"{host}: {what} asks for InfiniBand but the node has no InfiniBand devices: "
                        "NCCL falls back to TCP sockets, far slower between nodes",
                        "set NCCL_IB_DISABLE=1 (and drop NCCL_IB_HCA) here, or use InfiniBand nodes",
                        host,
                    )
                )
        elif env.get("NCCL_IB_HCA") and ib:
            exclude, exact, names = _nccl_list(env["NCCL_IB_HCA"])
            if not exclude:
                missing = [n for n in names if not any(d == n if exact else d.startswith(n) for d in ib)]
                if missing:
                    out.append(
                        Finding(
                            "nccl-ib-hca-missing",
                            E,
                            f"{host}: NCCL_IB_HCA names {', '.join(missing)} but the node has {', '.join(ib)}",
                            f"set NCCL_IB_HCA to devices of {host} ({', '.join(ib)})",
                            host,
                        )
                    )
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
            if not env.get(var):
                continue
            exclude, exact, names = _nccl_list(env[var])
            if var == "GLOO_SOCKET_IFNAME":
                exclude, exact = False, True  # gloo takes exact names, no list syntax
            matching = [i for i in ifaces if any(i == n if exact else i.startswith(n) for n in names)]
            if (not exclude and not matching) or (exclude and not [i for i in ifaces if i not in matching]):
                out.append(
                    Finding(
                        "socket-ifname-missing",
                        E,
                        f"{host}: {var}={env[var]} matches no interface (the node has {', '.join(ifaces) or 'none'})",
                        f"set {var} to one of: {', '.join(i for i in ifaces if i != 'lo') or 'lo'}",
                        host,
                    )
                )
    return out


def check_clock_skew(probes: Sequence[ProbeResult], limit_s: float = CLOCK_SKEW_LIMIT_S) -> list[Finding]:
    offsets = {p.host: p.clock_offset_s for p in probes if p.clock_offset_s is not None}
    if len(offsets) < 1:
        return []
    spread = max(offsets.values()) - min(offsets.values())
    worst = max(offsets.items(), key=lambda kv: abs(kv[1]))
    if spread > limit_s or abs(worst[1]) > limit_s:
        desc = ", ".join(f"{h} {o:+.1f} s" for h, o in offsets.items() if abs(o) > 0.05)
        return [
            Finding(
                "clock-skew",
                W,
                f"node clocks disagree by up to {max(spread, abs(worst[1])):.1f} s ({desc} vs this "
                "console): heartbeats, stragglers and log times will be misread",
                "run chrony or ntpd on every node",
                worst[0],
            )
        ]
    return []


def check_notify(command: str, which: Callable[[str], str | None] = shutil.which) -> list[Finding]:
    """`notify.command` runs on this machine (the console's or the supervisor's) when a run is
    launched, fails or ends: a program that is not there, or cannot run, would be found only then."""
    if not command:
        return []
    fix = "set notify.command to a program this machine can run (the event is its stdin), or ''"
    try:
        argv = shlex.split(command)
    except ValueError as err:  # an unclosed quote
        return [Finding("notify-command-unusable", E, f"notify.command {command!r}: {err}", fix)]
    if not argv:
        return []
    program = argv[0]
    if os.sep in program:
        why = (
            "does not exist"
            if not os.path.exists(program)
            else "is not an executable file"
            if not (os.path.isfile(program) and os.access(program, os.X_OK))
            else ""
        )
    else:
        why = "" if which(program) else "is not on PATH"
    if not why:
        return []
    return [Finding("notify-command-unusable", E, f"notify.command: {program} {why}", fix)]


def check_schedule(optim: OptimSection) -> list[Finding]:
    """A warm-up as long as the run or longer: the learning rate never reaches optim.lr (a short
    --set optim.max_steps over a preset's warm-up, most often)."""
    if optim.warmup_steps < optim.max_steps:
        return []
    return [
        Finding(
            "warmup-exceeds-max-steps",
            W,
            f"optim.warmup_steps {optim.warmup_steps} >= optim.max_steps {optim.max_steps}: the "
            f"learning rate never reaches optim.lr ({optim.lr:g})",
            f"--set optim.warmup_steps={max(optim.max_steps // 10, 0)}",
        )
    ]
