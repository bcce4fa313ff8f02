"""The preflight round: probe the nodes, run the node-side tests over the node runners, and pass
what they recorded to every check (`run_preflight`)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from taehv_console.core.cluster.bandwidth import measure_bandwidth
from taehv_console.core.cluster.gather import node_path, probe_hosts
from taehv_console.core.cluster.hosts import is_local_host
from taehv_console.core.cluster.nodecall import helper_name, read_reply
from taehv_console.core.cluster.preflight.data import check_data, check_loader, check_recipe, check_videos
from taehv_console.core.cluster.preflight.devices import (
    check_compile,
    check_gpu_homogeneity,
    check_memory_fit,
    check_processes_vs_gpus,
    check_visible_devices,
)
from taehv_console.core.cluster.preflight.findings import E, I, sort_findings
from taehv_console.core.cluster.preflight.network import (
    bandwidth_finding,
    check_master_port,
    check_one_machine_twice,
    check_reachability,
)
from taehv_console.core.cluster.preflight.software import (
    check_clock_skew,
    check_nccl_env,
    check_notify,
    check_schedule,
    check_version_skew,
)
from taehv_console.core.cluster.preflight.storage import check_disk, check_runs_shared
from taehv_console.core.cluster.ssh import NodeRunner, SshPool, SshSettings, resolve_target
from taehv_console.core.hostnames import host_port
from taehv_console.core.models import (
    BandwidthResult,
    Finding,
    NodeFacts,
    PreflightReport,
    ProbeResult,
    Topology,
)
from taehv_console.core.plan.planner import assumed_throughput
from trainer.config import TrainConfig

NODECHECK = "taehv_console.core.cluster.nodecheck"


def port_free(runner: NodeRunner, port: int) -> bool | None:
    """Whether `port` is free on the runner's node (nodecheck port-free); None when it does not answer."""
    answer = runner.call(NODECHECK, ["port-free", "--port", str(port)], timeout=30, require=("free",))
    return bool(answer.get("free")) if answer.ok else None


def first_free_port(runner: NodeRunner, first: int, tries: int = 50) -> int | None:
    """The first of `tries` ports from `first` on that is free on the runner's node; None when the
    node does not answer or none of them is."""
    for candidate in range(first, first + tries):
        free = port_free(runner, candidate)
        if free is None:
            return None
        if free:
            return candidate
    return None


def _facts(probes: Sequence[ProbeResult]) -> dict[str, NodeFacts]:
    return {p.host: p.facts for p in probes if p.facts is not None}


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
    video_scan_s: float = 20.0  # seconds each node spends opening its videos (0 = no scan)


def run_preflight(
    topology: Topology,
    cfg: TrainConfig,
    pool: SshPool | None = None,
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
    pool: SshPool,
    options: PreflightOptions,
    say: Callable[[str], None],
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
    findings += check_one_machine_twice(probes)

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
                    f"master port {host_port(topology.master_addr, port)} is checked on node 0, not here",
                )
            )
        else:
            if topology.uses_ssh and not is_local_host(master):
                master_addr = resolve_target(master, pool.settings).hostname
            say(f"checking master port {host_port(master_addr, port)}")
            findings += _check_port(
                pool,
                master,
                master_addr,
                port,
                [h for h in reachable if h != master],
                options.port_check_timeout_s,
                one_node=len(hosts) == 1,
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
                    "--family",
                    cfg.model.family,
                    "--space-scale",
                    str(cfg.clip_rule.space_scale),
                    "--time-scale",
                    str(cfg.clip_rule.time_scale),
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
        say("opening every video and measuring the data loader on every node")
        findings += _check_loader(pool, cfg, facts, data, options)
    elif data and options.video_scan_s > 0:
        say("opening every video on every node")
        findings += _check_videos(pool, cfg, facts, data, options)
    findings += check_disk(facts, cfg)
    findings += check_clock_skew(probes)
    findings += check_nccl_env(facts, cfg.distributed.nccl_env, cfg.topology.device)
    findings += check_memory_fit(cfg, facts)
    findings += check_compile(cfg)
    findings += check_notify(cfg.notify.command)
    findings += check_schedule(cfg.optim)
    return PreflightReport(topology=topology, probes=probes, findings=sort_findings(findings), bandwidth=bw)


def _ask_data_nodes(
    pool: SshPool,
    cfg: TrainConfig,
    facts: Mapping[str, NodeFacts],
    data: str,
    action: list[str],
    timeout: float,
) -> dict[str, dict]:
    """Each node whose data path exists, asked nodecheck `action` with the run's [data] section at the
    node's path: its answer, or {"ok": False, "error": why} where it gave none. Nodes whose data path
    is missing are already errors (check_data); asking there adds nothing."""
    hosts = [h for h, f in facts.items() if (p := f.path("data")) is None or p.exists]
    if not hosts:
        return {}
    section = cfg.data.model_copy(update={"source": node_path(data)}).model_dump_json()
    answers = pool.call_all(
        hosts, NODECHECK, [action[0], "--data-config", section, *action[1:]], timeout=timeout
    )
    return {h: dict(r.data) if r.ok else {"ok": False, "error": r.why} for h, r in answers.items()}


def _check_videos(
    pool: SshPool, cfg: TrainConfig, facts: Mapping[str, NodeFacts], data: str, options: PreflightOptions
) -> list[Finding]:
    answers = _ask_data_nodes(
        pool,
        cfg,
        facts,
        data,
        ["scan-videos", "--budget", str(options.video_scan_s)],
        timeout=options.video_scan_s + 60,  # the budget, plus the interpreter's start and the walk
    )
    return check_videos(answers) if answers else []


def _check_loader(
    pool: SshPool, cfg: TrainConfig, facts: Mapping[str, NodeFacts], data: str, options: PreflightOptions
) -> list[Finding]:
    measured = _ask_data_nodes(
        pool,
        cfg,
        facts,
        data,
        ["loader", "--clips", str(options.loader_clips), "--scan-budget", str(options.video_scan_s)],
        timeout=options.loader_timeout_s + options.video_scan_s,
    )
    if not measured:
        return []
    scans = {h: scan for h, m in measured.items() if isinstance(scan := m.pop("scan", None), dict)}
    findings = check_videos(scans) if options.video_scan_s > 0 else []
    targets = {}
    for h in measured:
        gpus = facts[h].visible_gpus
        targets[h] = assumed_throughput(cfg, gpus[0].name if gpus else "")[0]
    return findings + check_loader(measured, cfg, targets, facts)


def _check_port(
    pool: SshPool,
    master: str,
    master_addr: str,
    port: int,
    workers: list[str],
    timeout: float,
    one_node: bool = False,
) -> list[Finding]:
    if not workers:
        free = pool.call(master, NODECHECK, ["port-free", "--port", str(port)])
        return check_master_port(
            port, master, (bool(free.get("free")), free.why or "no answer"), {}, one_node=one_node
        )
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
