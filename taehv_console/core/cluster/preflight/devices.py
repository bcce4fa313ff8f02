"""Checks of the nodes' devices against the config: processes against GPUs and hostfile slots,
CUDA_VISIBLE_DEVICES, GPUs alike across nodes, and the planner's memory estimate on the real GPUs."""

from __future__ import annotations

from collections.abc import Mapping

from taehv_console.core.cluster.preflight.findings import E, I, W
from taehv_console.core.models import Finding, NodeFacts, Topology
from taehv_console.core.plan.planner import estimate_memory
from taehv_console.core.plan.zero import compile_under_zero3
from trainer.config import TrainConfig


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


def check_compile(cfg: TrainConfig) -> list[Finding]:
    """A config that compiles under ZeRO-3 (the 16/48/64-GPU presets keep their published stage),
    where DeepSpeed's hooks make the compiled step slower than the eager one."""
    said = compile_under_zero3(cfg)
    return [] if said is None else [Finding("compile-under-zero3", W, said[0], said[1])]
