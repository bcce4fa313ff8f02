"""Preflight: the cluster checked against a RunConfig before anything starts. Each check is a pure
function of recorded values (Topology, NodeFacts, TrainConfig, results of node-side tests) that
returns Findings; `run_preflight` gathers those values over the node runners and calls them all.
Errors stop a launch; warnings are shown and do not.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from taehv_console.core.cluster.bandwidth import measure_bandwidth
from taehv_console.core.cluster.gather import node_path, probe_hosts
from taehv_console.core.cluster.hosts import is_local_host
from taehv_console.core.cluster.nodecall import helper_name, read_reply
from taehv_console.core.cluster.ssh import SshPool, SshSettings, resolve_target
from taehv_console.core.models import (
    BandwidthResult,
    Finding,
    NodeFacts,
    PreflightReport,
    ProbeResult,
    Severity,
    Topology,
)
from taehv_console.core.plan.footprint import parameter_count
from taehv_console.core.plan.planner import assumed_throughput, estimate_memory
from trainer.config import TrainConfig

E, W, I = Severity.ERROR, Severity.WARNING, Severity.INFO
CLOCK_SKEW_LIMIT_S = 2.0
NODECHECK = "taehv_console.core.cluster.nodecheck"


def _facts(probes: Sequence[ProbeResult]) -> dict[str, NodeFacts]:
    return {p.host: p.facts for p in probes if p.facts is not None}


def sort_findings(findings: Sequence[Finding]) -> tuple[Finding, ...]:
    return tuple(sorted(findings, key=lambda f: (f.severity.rank, f.node or "", f.id)))


# ------------------------------------------------------------------------------------- pure checks


def check_reachability(probes: Sequence[ProbeResult]) -> list[Finding]:
    return [
        Finding("node-unreachable", E, p.error or f"{p.host}: no facts", p.fix, p.host)
        for p in probes
        if not p.ok
    ]


def check_processes_vs_gpus(
    topology: Topology, facts: Mapping[str, NodeFacts], cfg: TrainConfig
) -> list[Finding]:
    """Nodes and processes per node of the config against the machines' GPUs and hostfile slots."""
    out: list[Finding] = []
    want_nodes, want_ppn = cfg.topology.nodes, cfg.topology.gpus_per_node
    have_nodes = topology.node_count
    if cfg.topology.device == "cuda" and facts:
        gpus = {h: f.visible_gpu_count for h, f in facts.items()}
        counts = set(gpus.values())
        total = sum(gpus.values())
        # Per-node GPUs stand for all nodes when only this node was probed (platform launches).
        per_node = min(counts) if counts else 0
        if len(facts) < have_nodes:
            total = per_node * have_nodes
        if (
            (want_nodes != have_nodes or want_ppn > per_node)
            and want_nodes * want_ppn == total
            and per_node > 0
            and len(counts) == 1
        ):
            out.append(
                Finding(
                    "topology-mismatch",
                    E,
                    f"the config runs {want_nodes} node(s) × {want_ppn} processes, but the cluster is "
                    f"{have_nodes} node(s) × {per_node} GPUs: local rank {per_node} would ask for GPU ordinal "
                    f"{per_node} on a machine that has {per_node} (CUDA error: invalid device ordinal)",
                    f"run it as {have_nodes} nodes × {per_node}: --set topology.nodes={have_nodes} "
                    f"--set topology.gpus_per_node={per_node}, one launcher per node with machine ranks "
                    f"{_ranks_text(have_nodes)}",
                )
            )
            return out
        if want_nodes != have_nodes:
            out.append(
                Finding(
                    "node-count-mismatch",
                    E,
                    f"the config has topology.nodes = {want_nodes} but the {topology.source.value} topology has "
                    f"{have_nodes} node(s)",
                    f"--set topology.nodes={have_nodes}, or list {want_nodes} node(s) in the hostfile",
                )
            )
        for host, f in facts.items():
            n = f.visible_gpu_count
            if n == 0:
                out.append(
                    Finding(
                        "no-gpu",
                        E,
                        f"{host}: 0 GPUs ({f.gpu_reason or 'none visible'})",
                        "install/load the NVIDIA driver, fix CUDA_VISIBLE_DEVICES, or "
                        "--set topology.device=cpu for a CPU run",
                        host,
                    )
                )
            elif want_ppn > n:
                out.append(
                    Finding(
                        "processes-exceed-gpus",
                        E,
                        f"{host}: the config starts {want_ppn} processes per node but {n} GPU(s) are visible",
                        f"--set topology.gpus_per_node={n}",
                        host,
                    )
                )
            elif want_ppn < n:
                out.append(Finding("gpus-idle", I, f"{host}: {want_ppn} of {n} GPUs will be used", "", host))
    elif cfg.topology.device == "cpu":
        if want_nodes != have_nodes:
            out.append(
                Finding(
                    "node-count-mismatch",
                    E,
                    f"the config has topology.nodes = {want_nodes} but the {topology.source.value} topology has "
                    f"{have_nodes} node(s)",
                    f"--set topology.nodes={have_nodes}",
                )
            )
        for host, f in facts.items():
            if f.cpu_count and want_ppn > f.cpu_count:
                out.append(
                    Finding(
                        "processes-exceed-cpus",
                        W,
                        f"{host}: {want_ppn} CPU processes on {f.cpu_count} CPU(s) will crawl",
                        f"--set topology.gpus_per_node={max(1, f.cpu_count)}",
                        host,
                    )
                )
    # Hostfile slots say how many processes a node takes; more than its devices cannot start.
    for node in topology.nodes:
        nf = facts.get(node.host)
        if nf is None or node.slots is None:
            continue
        devices = nf.visible_gpu_count if cfg.topology.device == "cuda" else nf.cpu_count
        kind = "GPU(s) visible" if cfg.topology.device == "cuda" else "CPU(s)"
        if devices == 0:
            continue  # "no-gpu" already says it; "slots=0" would be no fix
        if node.slots > devices:
            out.append(
                Finding(
                    "slots-exceed-devices",
                    E,
                    f"{node.host}: the hostfile gives slots={node.slots} but the node has {devices} {kind}",
                    f"set '{node.host} slots={devices}' in the hostfile",
                    node.host,
                )
            )
        elif node.slots != want_ppn:
            out.append(
                Finding(
                    "slots-differ-from-config",
                    W,
                    f"{node.host}: hostfile slots={node.slots} but the config starts {want_ppn} processes per node",
                    f"make them agree: slots={want_ppn} or --set topology.gpus_per_node={node.slots}",
                    node.host,
                )
            )
    return out


def _ranks_text(n: int) -> str:
    ranks = [str(i) for i in range(n)]
    return " and ".join(ranks) if n <= 2 else ", ".join(ranks[:-1]) + " and " + ranks[-1]


def check_visible_devices(facts: Mapping[str, NodeFacts]) -> list[Finding]:
    out = []
    for host, f in facts.items():
        if f.invalid_visible_entries:
            bad = ",".join(f.invalid_visible_entries)
            out.append(
                Finding(
                    "visible-devices-invalid",
                    E,
                    f"{host}: CUDA_VISIBLE_DEVICES={f.cuda_visible_devices!r} names devices this node does not have "
                    f"({f.gpu_count} GPU(s), ordinals 0–{max(f.gpu_count - 1, 0)}): CUDA ignores '{bad}' and shows "
                    f"{f.visible_gpu_count} GPU(s)",
                    f"use ordinals 0–{max(f.gpu_count - 1, 0)} or UUIDs on {host}, or unset CUDA_VISIBLE_DEVICES",
                    host,
                )
            )
    return out


def check_gpu_homogeneity(facts: Mapping[str, NodeFacts]) -> list[Finding]:
    out = []
    models: dict[str, set[str]] = {}
    mem: dict[int, set[str]] = {}
    for host, f in facts.items():
        for g in f.visible_gpus:
            models.setdefault(g.name, set()).add(host)
            mem.setdefault(g.memory_total_mb // 1024, set()).add(host)
    if len(models) > 1:
        desc = "; ".join(f"{name} on {', '.join(sorted(h))}" for name, h in sorted(models.items()))
        out.append(
            Finding(
                "gpu-models-differ",
                W,
                f"GPU models differ ({desc}): the slowest GPU paces every step",
                "use nodes of one GPU model, or accept the slowest one's speed",
            )
        )
    if len(mem) > 1:
        smallest = min(mem)
        out.append(
            Finding(
                "gpu-memory-differs",
                W,
                f"GPU memory differs across GPUs ({', '.join(f'{m} GB' for m in sorted(mem))}): "
                f"the {smallest} GB GPUs bound the batch size",
                f"plan for {smallest} GB (--set topology.gpu_memory_gb={smallest})",
            )
        )
    return out


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


def check_data(facts: Mapping[str, NodeFacts], data_source: str) -> list[Finding]:
    if not data_source:
        # Only the smoke preset runs without data (the console generates clips for it).
        return [
            Finding(
                "data-not-set",
                W,
                "no data source: data.source is empty; only generated demo clips can be trained on",
                "--data DIR (a directory of videos or an annotation JSON)",
            )
        ]
    out = []
    for host, f in facts.items():
        p = f.path("data")
        if p is None:
            continue
        if not p.exists:
            out.append(
                Finding(
                    "data-missing",
                    E,
                    f"{host}: data source {p.path} does not exist",
                    f"mount or copy the data to the same path on {host}",
                    host,
                )
            )
        elif not p.readable:
            out.append(
                Finding(
                    "data-unreadable",
                    E,
                    f"{host}: data source {p.path} is not readable",
                    f"fix its permissions for the user the console logs in as on {host}",
                    host,
                )
            )
    return out


def check_recipe(cfg: TrainConfig, answers: Mapping[str, dict | str]) -> list[Finding]:
    """The teacher (or its latent cache) as each node answered nodecheck `teacher`/`latent-cache`:
    a dict, or the text of a failure to run it. A distilling run never starts without one."""
    if not cfg.loss.distilling:
        return []
    cached = bool(cfg.loss.teacher_cache)
    path = cfg.loss.teacher_cache if cached else cfg.loss.teacher
    what = "latent cache (loss.teacher_cache)" if cached else "teacher VAE (loss.teacher)"
    fix = (
        (
            "build it with `taehv-train cache-latents --run RUN` on storage every node mounts, or unset "
            "loss.teacher_cache to run the teacher online"
        )
        if cached
        else (
            "put a diffusers AutoencoderKLHunyuanVideo directory (save_pretrained) at that path on every node, "
            "or unset loss.teacher to train by reconstruction only"
        )
    )
    out = []
    for host, a in answers.items():
        if isinstance(a, str) or not a:
            out.append(
                Finding(
                    "teacher-unchecked",
                    E,
                    f"{host}: could not check the {what} {path}: {a or 'no answer'}",
                    fix,
                    host,
                )
            )
        elif not a.get("ok"):
            out.append(Finding("teacher-unusable", E, f"{host}: {what} {path}: {a.get('error')}", fix, host))
        elif not cached:
            shape = "x".join(str(v) for v in a.get("latent_shape", []))
            out.append(
                Finding(
                    "teacher-ok",
                    I,
                    f"{host}: teacher {path} loads; an 8-frame 16x16 clip gives "
                    f"latents {shape} (T/4 x C x H/8 x W/8)",
                    "",
                    host,
                )
            )
        else:
            out.append(
                Finding(
                    "latent-cache-ok", I, f"{host}: latent cache {path}: {a.get('clips')} clips", "", host
                )
            )
    return out


def check_loader(
    measured: Mapping[str, Mapping],
    cfg: TrainConfig,
    clips_per_s_per_gpu: Mapping[str, float],
    facts: Mapping[str, NodeFacts] | None = None,
) -> list[Finding]:
    """Each node's loader measurement (nodecheck `loader`: CPU-s per clip on its own videos) against
    the planner's clips/s per GPU: data.num_workers workers, one core each, must keep up."""
    out: list[Finding] = []
    workers = cfg.data.num_workers
    d = cfg.data
    clip = f"{d.frames}x{d.height}x{d.width}"
    for host, m in measured.items():
        if not m.get("ok"):
            why = m.get("error") or "no answer"
            if m.get("data_error"):
                out.append(
                    Finding(
                        "data-gives-no-clips",
                        E,
                        f"{host}: the data loader cannot make a {clip} clip: {why}",
                        "fix the videos or the data settings it names",
                        host,
                    )
                )
            else:
                out.append(
                    Finding(
                        "loader-not-measured",
                        W,
                        f"{host}: the loader could not be measured: {why}",
                        "run `taehv-train bench-data DIR` on that node to see why",
                        host,
                    )
                )
            continue
        cpu_s = float(m["load_cpu_s"])
        target = clips_per_s_per_gpu.get(host, 0.0)
        per_worker = 1.0 / cpu_s if cpu_s > 0 else float("inf")
        # Without workers the rank loads in its own process: one worker's rate, paid inside the step.
        rate = per_worker * max(workers, 1)
        need = max(1, math.ceil(target * cpu_s))
        what = (
            f"{host}: the loader takes {cpu_s:.3f} CPU-s per {clip} clip of {m.get('source', 'these')} "
            f"videos ({per_worker:.1f} clips/s per worker)"
        )
        if rate < target:
            fix = f"--set data.num_workers={need}"
            f = facts.get(host) if facts else None
            cores = need * cfg.topology.gpus_per_node
            if f is not None and f.cpu_count and cores > f.cpu_count:
                fix += (
                    f" ({cores} loader processes per node, {host} has {f.cpu_count} CPUs: also "
                    "pre-scale the videos towards the training size, which makes decoding cheaper)"
                )
            out.append(
                Finding(
                    "loader-too-slow",
                    W,
                    f"{what}: {workers} worker(s) per GPU give {rate:.1f} clips/s, the plan "
                    f"assumes {target:.1f} clips/s per GPU, so GPUs would wait for data",
                    fix,
                    host,
                )
            )
        else:
            out.append(
                Finding(
                    "loader-ok",
                    I,
                    f"{what}: {workers} worker(s) per GPU give {rate:.1f} clips/s "
                    f"(the plan assumes {target:.1f})",
                    "",
                    host,
                )
            )
        skipped = m.get("skipped") or []
        if skipped:
            out.append(
                Finding(
                    "loader-skipped-videos",
                    W,
                    f"{host}: {len(skipped)} of the sampled videos gave no clip: " + "; ".join(skipped[:3]),
                    "training skips them too (each reported as a data event); fix or remove them",
                    host,
                )
            )
    return out


def check_runs_shared(shared: Mapping[str, bool] | None, runs_dir: str, writer: str = "") -> list[Finding]:
    """`shared` maps each other node to whether it read the token `writer` wrote; None = not tested."""
    if not shared:
        return []
    missing = sorted(h for h, ok in shared.items() if not ok)
    if not missing:
        return [Finding("runs-shared", I, f"runs directory {runs_dir} is shared by all nodes")]
    return [
        Finding(
            "runs-not-shared",
            W,
            f"runs directory {runs_dir} is not shared: a file written on {writer or 'the master'} is not seen on "
            f"{', '.join(missing)}. Each node would write its own ZeRO shards of a checkpoint to its own disk, "
            "so no single node holds a complete checkpoint: rank 0 cannot verify one, and a resume needs "
            "every node's disk back in the same place",
            "put --runs on storage every node mounts at the same path (NFS, Lustre, a shared volume)",
        )
    ]


def checkpoint_bytes(cfg: TrainConfig) -> float:
    """One checkpoint: 16 bytes per parameter for weights, gradients' fp32 master and AdamW state
    (the planner's accounting), plus 4 per parameter for an EMA copy."""
    params = parameter_count(cfg.model).total
    return params * (16 + (4 if cfg.optim.ema_decay > 0 else 0))


def check_disk(facts: Mapping[str, NodeFacts], cfg: TrainConfig) -> list[Finding]:
    # keep_checkpoints complete ones plus the one being written, plus final/ and best/ weights.
    per_ckpt = checkpoint_bytes(cfg)
    need_gb = (per_ckpt * (cfg.schedule.keep_checkpoints + 1) + 2 * per_ckpt / 4) / 1e9
    out = []
    for host, f in facts.items():
        p = f.path("runs")
        if p is None or p.free_gb is None:
            continue
        if not p.writable:
            out.append(
                Finding(
                    "runs-not-writable",
                    E,
                    f"{host}: runs directory {p.path} is not writable",
                    f"choose a writable --runs or fix permissions on {host}",
                    host,
                )
            )
        elif p.free_gb < need_gb:
            out.append(
                Finding(
                    "disk-too-small",
                    E,
                    f"{host}: {p.free_gb:.1f} GB free at {p.fs_path}, {cfg.schedule.keep_checkpoints} kept "
                    f"checkpoints + one being written need ~{need_gb:.2f} GB",
                    "free space there, choose another --runs, or lower schedule.keep_checkpoints (≥ 2)",
                    host,
                )
            )
        elif p.free_gb < 2 * need_gb:
            out.append(
                Finding(
                    "disk-tight",
                    W,
                    f"{host}: {p.free_gb:.1f} GB free at {p.fs_path}, "
                    f"~{need_gb:.2f} GB needed: little room for logs and TensorBoard",
                    "",
                    host,
                )
            )
    return out


def check_master_port(
    port: int, master: str, free: tuple[bool, str] | None, reach: Mapping[str, tuple[bool, str]]
) -> list[Finding]:
    out = []
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
                    f"{host}: cannot reach the master {master}:{port} ({why})",
                    f"open TCP {port} on {master} to the other nodes (firewall, security group), "
                    "or check that the master address resolves to an address they can route to",
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


def check_memory_fit(cfg: TrainConfig, facts: Mapping[str, NodeFacts]) -> list[Finding]:
    """The planner's estimate, against the smallest GPU actually present (not the config's claim)."""
    out = []
    checked = cfg
    if cfg.topology.device == "cuda":
        mems = [g.memory_gb for f in facts.values() for g in f.visible_gpus]
        if mems:
            real = min(mems) * 1.073741824  # GiB (NVML) to GB (the planner's unit)
            if real < cfg.topology.gpu_memory_gb * 0.98:
                out.append(
                    Finding(
                        "gpu-memory-smaller",
                        W,
                        f"the config assumes {cfg.topology.gpu_memory_gb:g} GB per GPU, the smallest "
                        f"GPU here has {real:.0f} GB; the fit below uses the real figure",
                        f"--set topology.gpu_memory_gb={int(real)}",
                    )
                )
            checked = cfg.model_copy(
                update={"topology": cfg.topology.model_copy(update={"gpu_memory_gb": round(real, 1)})}
            )
    fit = estimate_memory(checked)
    unit = "GPU" if cfg.topology.device == "cuda" else "process"
    if fit.fits:
        out.append(
            Finding("memory-fit", I, f"memory: ~{fit.per_gpu_gb:.1f} GB of {fit.gpu_gb:g} GB per {unit}")
        )
    else:
        out.append(
            Finding(
                "memory-does-not-fit",
                E,
                f"memory: ~{fit.per_gpu_gb:.1f} GB needed per {unit}, {fit.gpu_gb:g} GB available",
                "; ".join(fit.notes) or "lower optim.batch_per_gpu",
            )
        )
    if cfg.topology.device == "cpu":
        # CPU processes share the node's RAM: the per-process estimate times processes per node.
        need = fit.per_gpu_gb * cfg.topology.gpus_per_node
        for host, f in facts.items():
            if f.ram_gb and need > f.ram_gb:
                out.append(
                    Finding(
                        "ram-too-small",
                        E,
                        f"{host}: {cfg.topology.gpus_per_node} CPU processes need ~{need:.1f} GB, "
                        f"the node has {f.ram_gb:.1f} GB of RAM",
                        "fewer processes per node (topology.gpus_per_node) or smaller clips",
                        host,
                    )
                )
    for note in fit.notes:
        if fit.fits:
            out.append(Finding("planner-note", I, note))
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


# -------------------------------------------------------------------------------------- gathering


@dataclass(frozen=True)
class PreflightOptions:
    runs_dir: str = "runs"
    data_source: str | None = None  # None: the config's data.source
    master_port: int | None = None  # None: the topology's
    bandwidth: bool = False
    bandwidth_megabytes: float = 64.0
    assumed_gbps: float | None = None
    probe_timeout_s: float | None = None
    port_check_timeout_s: float = 5.0
    loader_clips: int = 3  # clips each node prepares to measure its loader (0 = not measured)
    loader_timeout_s: float = 180.0


def run_preflight(
    topology: Topology,
    cfg: TrainConfig,
    pool=None,
    options: PreflightOptions = PreflightOptions(),
    progress: Callable[[str], None] | None = None,
    probes: Sequence[ProbeResult] | None = None,
) -> PreflightReport:
    """Probe the nodes, run the node-side tests, and check everything. With a hostfile every node is
    reached (SSH, or directly for localhost); for platform topologies only this node is checked,
    since the platform starts the others. `probes` from an earlier round are reused when they
    already cover the same hosts and paths."""
    say = progress or (lambda _msg: None)
    own_pool = pool is None
    pool = pool or SshPool(SshSettings.from_env())
    try:
        return _run(topology, cfg, pool, options, say, probes)
    finally:
        if own_pool:
            pool.close()


def _reusable(
    probes: Sequence[ProbeResult] | None, hosts: list[str], paths: Mapping[str, str]
) -> TypeGuard[Sequence[ProbeResult]]:
    if not probes or [p.host for p in probes] != hosts:
        return False
    for p in probes:
        if p.facts is None:
            return False  # an unreachable node gets a second chance
        for label, path in paths.items():
            info = p.facts.path(label)
            if info is None or info.path != str(Path(path).expanduser()):
                return False
    return True


def _run(
    topology: Topology,
    cfg: TrainConfig,
    pool,
    options: PreflightOptions,
    say,
    earlier: Sequence[ProbeResult] | None,
) -> PreflightReport:
    findings: list[Finding] = []
    hosts = list(topology.hosts) if topology.uses_ssh else ["localhost"]
    if not topology.uses_ssh and topology.node_count > 1:
        findings.append(
            Finding(
                "other-nodes-not-probed",
                I,
                f"{topology.source.value}: only this node was checked; the platform starts the "
                f"other {topology.node_count - 1} node(s) with the same image",
            )
        )
    data = options.data_source if options.data_source is not None else cfg.data.source
    runs_dir = node_path(options.runs_dir)
    paths = {"runs": runs_dir}
    if data:
        paths["data"] = node_path(data)
    if _reusable(earlier, hosts, paths):
        probes = tuple(earlier)
    else:
        say(f"probing {len(hosts)} node(s)")
        probes = probe_hosts(hosts, pool, paths, timeout=options.probe_timeout_s)
    facts = _facts(probes)
    findings += check_reachability(probes)

    # runs dir shared? node 0 writes a token, the others read it
    shared: dict[str, bool] | None = None
    reachable = [h for h in hosts if h in facts]
    if len(reachable) > 1:
        say("checking that the runs directory is shared")
        token = secrets.token_hex(8)
        writer = reachable[0]
        wrote = pool.call(writer, NODECHECK, ["token-write", runs_dir, token])
        if wrote.get("ok"):
            reads = pool.call_all(reachable[1:], NODECHECK, ["token-read", runs_dir, token])
            shared = {h: bool(r.get("found")) for h, r in reads.items()}
            pool.call(writer, NODECHECK, ["token-remove", runs_dir, token])
            findings += check_runs_shared(shared, runs_dir, writer)
        else:
            findings.append(
                Finding(
                    "runs-not-writable",
                    E,
                    f"{writer}: cannot write into runs directory {runs_dir} ({wrote.why or 'no answer'})",
                    "choose a writable --runs",
                    writer,
                )
            )

    # master port: free on the master, reachable from every worker
    port = options.master_port or topology.master_port
    master = hosts[0]
    master_addr = topology.master_addr
    bw: BandwidthResult | None = None
    if master in facts:
        if topology.uses_ssh and len(hosts) > 1 and is_local_host(master):
            findings.append(
                Finding(
                    "master-is-localhost",
                    E,
                    f"the first hostfile line ({master}) is the master, and the other nodes "
                    f"would reach their own {master}, not this machine",
                    "name this machine by an address the other nodes can reach",
                )
            )
        elif not topology.uses_ssh and topology.this_node_rank not in (None, 0):
            # A worker pod: the master port lives on pod 0, whose listener is not up yet.
            findings.append(
                Finding(
                    "master-port-not-checked",
                    I,
                    f"master port {topology.master_addr}:{port} is checked on node 0, not here",
                )
            )
        else:
            if topology.uses_ssh and not is_local_host(master):
                master_addr = resolve_target(master, pool.settings).hostname
            say(f"checking master port {master_addr}:{port}")
            findings += _check_port(
                pool,
                master,
                master_addr,
                port,
                [h for h in reachable if h != master],
                options.port_check_timeout_s,
            )
        if options.bandwidth and not any(f.id.startswith("master-") for f in findings):
            if len(reachable) < 2 or len(reachable) != len(hosts):
                findings.append(
                    Finding(
                        "bandwidth-skipped", I, "bandwidth test skipped: it needs two or more reachable nodes"
                    )
                )
            else:
                say("measuring all-reduce bandwidth")

                use_nccl = (
                    cfg.topology.device == "cuda"
                    and all(f.visible_gpu_count for f in facts.values())
                    and all(f.torch_cuda_version for f in facts.values())
                )
                try:
                    bw = measure_bandwidth(
                        [pool.runner(h) for h in hosts],
                        master_addr,
                        port,
                        megabytes=options.bandwidth_megabytes,
                        backend="nccl" if use_nccl else "gloo",
                        env=cfg.distributed.nccl_env,
                    )
                    findings.append(bandwidth_finding(bw, options.assumed_gbps))
                except Exception as err:  # noqa: BLE001 - a failed measurement is a finding
                    findings.append(
                        Finding(
                            "bandwidth-failed",
                            E,
                            f"all-reduce between the nodes failed: {err}",
                            getattr(err, "fix", "") or "check the NCCL/GLOO socket settings",
                        )
                    )

    if cfg.loss.distilling and reachable:
        say(
            "checking the teacher on every node"
            if not cfg.loss.teacher_cache
            else "checking the latent cache"
        )

        if cfg.loss.teacher_cache:
            answers = pool.call_all(
                reachable, NODECHECK, ["latent-cache", node_path(cfg.loss.teacher_cache)], timeout=60
            )
        else:
            answers = pool.call_all(
                reachable,
                NODECHECK,
                [
                    "teacher",
                    node_path(cfg.loss.teacher),
                    "--subfolder",
                    cfg.loss.teacher_subfolder,
                    "--channels",
                    str(cfg.model.latent_channels),
                ],
                timeout=600,
            )
        findings += check_recipe(cfg, {h: dict(r.data) if r.ok else r.why for h, r in answers.items()})
    findings += check_processes_vs_gpus(topology, facts, cfg)
    findings += check_visible_devices(facts)
    if cfg.topology.device == "cuda":
        findings += check_gpu_homogeneity(facts)
    findings += check_version_skew(facts, cfg.topology.device)
    findings += check_data(facts, data or "")
    if data and options.loader_clips > 0:
        say("measuring the data loader on every node")
        findings += _check_loader(pool, cfg, facts, data, options)
    findings += check_disk(facts, cfg)
    findings += check_clock_skew(probes)
    findings += check_nccl_env(facts, cfg.distributed.nccl_env, cfg.topology.device)
    findings += check_memory_fit(cfg, facts)
    return PreflightReport(topology=topology, probes=probes, findings=sort_findings(findings), bandwidth=bw)


def _check_loader(
    pool, cfg: TrainConfig, facts: Mapping[str, NodeFacts], data: str, options: PreflightOptions
) -> list[Finding]:
    # nodes whose data path is missing are already errors (check_data); measuring there adds nothing
    hosts = [h for h, f in facts.items() if (p := f.path("data")) is None or p.exists]
    if not hosts:
        return []
    section = cfg.data.model_copy(update={"source": node_path(data)}).model_dump_json()
    answers = pool.call_all(
        hosts,
        NODECHECK,
        ["loader", "--data-config", section, "--clips", str(options.loader_clips)],
        timeout=options.loader_timeout_s,
    )
    measured = {h: dict(r.data) if r.ok else {"ok": False, "error": r.why} for h, r in answers.items()}
    targets = {}
    for h in hosts:
        gpus = facts[h].visible_gpus
        targets[h] = assumed_throughput(cfg, gpus[0].name if gpus else "")[0]
    return check_loader(measured, cfg, targets, facts)


def _check_port(
    pool, master: str, master_addr: str, port: int, workers: list[str], timeout: float
) -> list[Finding]:
    if not workers:
        free = pool.call(master, NODECHECK, ["port-free", "--port", str(port)])
        return check_master_port(port, master, (bool(free.get("free")), free.why or "no answer"), {})
    try:
        m = pool.runner(master)
        stream = m.open(
            [m.python, "-m", NODECHECK, "listen", "--port", str(port), "--seconds", str(timeout * 4 + 10)]
        )
    except Exception as err:  # noqa: BLE001 - the node's answer, whatever failed, is the finding
        return check_master_port(port, master, (False, str(err)), {})
    try:
        state = read_reply(stream, master, helper_name(NODECHECK, ["listen"]), timeout + 10)
        if not state.get("listening"):
            return check_master_port(port, master, (False, state.why or "the listener did not start"), {})
        answers = pool.call_all(
            workers,
            NODECHECK,
            ["connect", "--host", master_addr, "--port", str(port), "--timeout", str(timeout)],
            timeout=timeout + 30,
        )
        reach = {h: (bool(r.get("ok")), r.why) for h, r in answers.items()}
        return check_master_port(port, master, (True, ""), reach)
    finally:
        stream.close()  # closes the listener's stdin: it exits at once
