"""Fixed ClusterState and wizard samples built from core's own dataclasses: a 1-node 8-GPU run,
and N-node runs (16 for snapshots, 64 for the idle benchmark) with a straggler, a stalled node
holding the collective and a failed node. Every value is a function of its index (no clock, no
randomness), so the same sample always draws the same screen."""

from __future__ import annotations

import math

from taehv_console.core.models import (
    Finding,
    GpuInfo,
    NodeFacts,
    NodeSpec,
    PathInfo,
    PreflightReport,
    ProbeResult,
    Severity,
    Topology,
    TopologySource,
)
from taehv_console.core.watch.nodesample import DiskSample, GpuSample, NodeSample
from taehv_console.core.watch.state import (
    CheckpointInfo,
    CheckpointState,
    CheckpointSummary,
    ClusterState,
    CollectiveStall,
    Histories,
    NodeSnapshot,
    NodeState,
    Notice,
    RankHealth,
    RankState,
    RunHeader,
    Series,
)

T0 = 1_767_225_600.0  # the samples' "now" (2026-01-01 00:00 UTC)
GPUS = 8
H100 = "NVIDIA H100 80GB HBM3"


def _wave(i: int, k: int, lo: float, hi: float) -> float:
    return lo + (hi - lo) * (0.5 + 0.5 * math.sin(1.7 * i + 0.9 * k))


def node_name(i: int) -> str:
    return f"gpu-node-{i + 1:02d}"


def _gpus(
    node: int, util_scale: float = 1.0, error: str = "", throttle: tuple[str, ...] = ()
) -> tuple[GpuSample, ...]:
    out = []
    for g in range(GPUS):
        util = round(_wave(node, g, 86, 99) * util_scale)
        out.append(
            GpuSample(
                index=g,
                name=H100,
                uuid=f"GPU-{node:02d}{g}",
                util_pct=util,
                mem_util_pct=util * 0.6,
                mem_used_mb=round(_wave(node, g, 61_000, 66_000)),
                mem_total_mb=81_559,
                temp_c=round(_wave(node, g, 58, 71)),
                power_w=round(_wave(node, g, 540, 660)),
                power_limit_w=700,
                run_mem_mb=round(_wave(node, g, 60_000, 65_000)),
                run_pids=(40_000 + node * 10 + g,),
                throttle=throttle if g == 3 else (),
                error=error if g == 5 else "",
            )
        )
    return tuple(out)


def _sample(node: int, gpus: tuple[GpuSample, ...]) -> NodeSample:
    return NodeSample(
        host=node_name(node),
        time=T0 - 0.3,
        seq=4000 + node,
        interval_s=1.0,
        gpu_ok=True,
        gpus=gpus,
        cpu_pct=round(_wave(node, 1, 18, 31), 1),
        cpu_count=192,
        load1=24.0,
        ram_used_gb=round(_wave(node, 2, 410, 520)),
        ram_total_gb=2015.0,
        disks=(DiskSample("/shared/runs", 12_400.0, 20_000.0, 7_600.0),),
        net_rx_mbps=round(_wave(node, 3, 9_000, 11_000)),
        net_tx_mbps=round(_wave(node, 4, 9_000, 11_000)),
        agent_pid=900 + node,
        received=T0 - 0.3,
    )


def _history(n_nodes: int, step: int) -> Histories:
    steps = range(max(1, step - 599), step + 1, 1)
    loss = tuple((float(s), 0.011 + 0.09 * math.exp(-s / 2500) + 0.0015 * math.sin(s / 7.0)) for s in steps)
    psnr = tuple((float(s), 31.6 - 9.0 * math.exp(-s / 2500) + 0.25 * math.sin(s / 5.0)) for s in steps)
    lr = tuple((float(s), 1e-4) for s in steps[::10])
    util = tuple(
        Series(
            f"{node_name(n)}/{g}", tuple((T0 - 120 + t, _wave(n, g + t, 80, 99)) for t in range(0, 120, 2))
        )
        for n in range(min(n_nodes, 2))
        for g in range(GPUS)
    )
    return Histories(
        loss=Series("loss", loss),
        psnr=Series("psnr", psnr),
        lr=Series("lr", lr),
        clips_per_s=Series("clips_per_s", tuple((float(s), 38.0) for s in steps[::10])),
        gpu_util=util,
    )


def cluster_state(n_nodes: int = 1, trouble: bool = False) -> ClusterState:
    """A running run on n_nodes x 8 H100. With trouble (needs >= 13 nodes): node 4 is a straggler,
    node 6 stalls the collective (rank 41 stopped making progress), node 12 failed (CUDA OOM)."""
    step = 12_345
    world = n_nodes * GPUS
    straggler, stalled, failed = (3, 5, 11) if trouble else (-1, -1, -1)
    nodes, ranks = [], []
    for n in range(n_nodes):
        name = node_name(n)
        state, detail = NodeState.OK, ""
        gpus = _gpus(n)
        if n == straggler:
            state, detail = NodeState.DEGRADED, "rank 27 straggles: score 0.62"
            gpus = _gpus(n, throttle=("hw_thermal_slowdown",))
        elif n == stalled:
            state, detail = NodeState.STALLED, "rank 41: no progress for 5m12s"
            gpus = _gpus(n, util_scale=0.0)
        elif n == failed:
            state, detail = NodeState.FAILED, "rank 90 exited 1: CUDA error: out of memory"
            gpus = _gpus(n, util_scale=0.0, error="GPU is lost")
        node_ranks = tuple(range(n * GPUS, (n + 1) * GPUS))
        nodes.append(
            NodeSnapshot(
                name=name,
                state=state,
                detail=detail,
                sample=_sample(n, gpus),
                sample_age_s=0.3,
                ranks=node_ranks,
                clock_offset_s=0.004 * (n % 3),
                agent="running",
            )
        )
        for r in node_ranks:
            rs, score, busy, age, detail_r, blocked = (
                RankState.HEALTHY,
                round(_wave(r, 0, 0.93, 1.0), 2),
                3.05,
                0.4,
                "",
                None,
            )
            if trouble:
                age, blocked = 312.0, 41
            if r == 27:
                rs, score, busy = RankState.STRAGGLER, 0.62, 4.9
            if r == 41:
                rs, detail_r, blocked = (
                    RankState.STALLED,
                    "no heartbeat progress for 5m12s (holds the all-reduce)",
                    None,
                )
            if n == failed:
                rs, detail_r, blocked = (
                    RankState.FAILED,
                    "CUDA error: out of memory" if r == 90 else "killed",
                    None,
                )
            ranks.append(
                RankHealth(
                    rank=r,
                    node=name,
                    state=rs,
                    step=step - (1 if r == 41 else 0),
                    heartbeat_age_s=age,
                    step_time_s=3.35,
                    busy_s=busy,
                    score=score,
                    metrics=(("data_wait_s", 1.04 if r % GPUS == 3 else 0.07), ("step_time_s", 3.35)),
                    pid=40_000 + r,
                    process="running" if rs != RankState.FAILED else "gone",
                    blocked_by=blocked if r != 41 else None,
                    detail=detail_r,
                )
            )
    collective = (
        CollectiveStall(
            laggard_rank=41,
            laggard_node=node_name(stalled),
            step=step - 1,
            stalled_for_s=312.0,
            timeout_s=7200.0,
            waiting_ranks=tuple(r for r in range(world) if r != 41)[:8],
            evidence="every live rank waits in the same all-reduce",
        )
        if trouble
        else None
    )
    items = [
        CheckpointInfo(
            "step-12000",
            12_000,
            CheckpointState.COMPLETE,
            bytes=412_000_000,
            age_s=1150.0,
            world_size=world,
            zero_stage=3 if n_nodes > 1 else 2,
            is_latest=True,
        ),
        CheckpointInfo(
            "step-11000",
            11_000,
            CheckpointState.COMPLETE,
            bytes=412_000_000,
            age_s=4500.0,
            world_size=world,
            zero_stage=3 if n_nodes > 1 else 2,
        ),
    ]
    problems: tuple[str, ...] = ()
    if trouble:
        items.insert(
            0,
            CheckpointInfo(
                "step-12500.tmp",
                12_500,
                CheckpointState.INCOMPLETE,
                age_s=900.0,
                problems=("no COMPLETE marker: a save that never finished",),
            ),
        )
    checkpoints = CheckpointSummary(
        items=tuple(items),
        latest="step-12000",
        newest_complete_step=12_000,
        every=1000,
        next_due_step=13_000,
        problems=problems,
    )
    notices = [
        Notice(T0 - 1150, "info", "checkpoint", "checkpoint step 12000 complete (41.2 s, 412 MB)"),
        Notice(
            T0 - 900,
            "warning",
            "events",
            "data: skipped clip_00412.mp4 (corrupt: moov atom not found)",
            rank=3,
            node=node_name(0),
        ),
        Notice(T0 - 600, "info", "events", "validation step 12000: PSNR 30.91 dB"),
    ]
    if trouble:
        notices += [
            Notice(T0 - 700, "warning", "health", f"node {node_name(straggler)}: ok -> degraded"),
            Notice(
                T0 - 330,
                "warning",
                "log",
                "NCCL WARN NET/IB : Got completion with error 12, opcode 0",
                rank=41,
                node=node_name(stalled),
            ),
            Notice(
                T0 - 312,
                "warning",
                "health",
                f"collective stalled: waiting for rank 41 on {node_name(stalled)} (heartbeats)",
            ),
            Notice(
                T0 - 40,
                "error",
                "log",
                "CUDA error: out of memory (rank 90)",
                rank=90,
                node=node_name(failed),
            ),
            Notice(T0 - 39, "error", "health", f"node {node_name(failed)}: ok -> failed"),
        ]
    notices.sort(key=lambda x: x.time)
    phase = "failed" if trouble else "running"
    header = RunHeader(
        run_dir=f"/shared/runs/20251231-121500-{n_nodes * GPUS}gpu",
        run_id=f"20251231-121500-{'8gpu-h100' if n_nodes == 1 else 'derived'}",
        phase=phase,
        console_phase="running",
        step=step,
        max_steps=100_000,
        world_size=world,
        preset="8gpu-h100" if n_nodes == 1 else "derived from 64gpu-h100",
        loss=0.0123,
        psnr=31.42,
        lr=1e-4,
        clips_per_s=38.2 * n_nodes,
        step_time_s=3.35,
        eta_s=(100_000 - step) * 3.35,
        val_step=12_000,
        val_psnr=30.91,
        best_val_psnr=31.05,
        started=T0 - 41_400.0,
        updated=T0 - 0.4,
        data_skipped=1,
    )
    return ClusterState(
        time=T0,
        seq=777,
        run=header,
        nodes=tuple(nodes),
        ranks=tuple(ranks),
        collective=collective,
        checkpoints=checkpoints,
        history=_history(n_nodes, step),
        notices=tuple(notices),
    )


LOG_LINES = tuple(
    [
        f"[2025-12-31 12:15:{i:02d}] [INFO] [launch.py:146] rank {i % 8}: step {12_300 + i} loss 0.0124 psnr 31.40"
        for i in range(30)
    ]
    + [
        "gpu-node-06:4127:4210 [1] NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129",
        (
            "[rank41]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=24690, OpType=ALLREDUCE) "
            "ran for 312013 milliseconds"
        ),
    ]
)


# ------------------------------------------------------------------------------------- wizard


def facts(i: int, gpus: int = GPUS) -> NodeFacts:
    return NodeFacts(
        hostname=node_name(i),
        addresses=(f"10.0.0.{i + 11}",),
        gpus=tuple(GpuInfo(g, H100, 81_559, f"GPU-{i:02d}{g}") for g in range(gpus)),
        driver_version="550.90.07",
        cuda_driver_version="12.4",
        visible_gpu_indices=tuple(range(gpus)),
        cpu_count=192,
        ram_gb=2015.0,
        paths=(PathInfo("runs", "/shared/runs", True, True, True, True, 7600.0, 20000.0),),
        python_version="3.11.9",
        torch_version="2.5.1+cu124",
        deepspeed_version="0.16.2",
        accelerate_version="1.2.1",
        nccl_version="2.21.5",
        ib_devices=("mlx5_0",),
    )


def topology(n_nodes: int) -> Topology:
    if n_nodes == 1:
        return Topology(
            TopologySource.LOCAL,
            1,
            (NodeSpec("localhost", 0, GPUS),),
            detail="this machine only",
            processes_per_node=None,
        )
    return Topology(
        TopologySource.HOSTFILE,
        n_nodes,
        tuple(NodeSpec(node_name(i), i, GPUS) for i in range(n_nodes)),
        master_addr=node_name(0),
        detail="hostfile /shared/hostfile (16 hosts)",
    )


def probes(n_nodes: int) -> tuple[ProbeResult, ...]:
    if n_nodes == 1:
        return (ProbeResult("localhost", facts(0), seconds=0.41, clock_offset_s=0.0),)
    out = []
    for i in range(n_nodes):
        name = node_name(i)
        if i == 9:
            out.append(
                ProbeResult(
                    name,
                    error=f"{name}: host key not in ~/.ssh/known_hosts (ssh-ed25519 "
                    "SHA256:q3Vb0mS8Ew1rZ1hX7yq0c5Tg3mJw2x8nK1pL0aQ4bEo); refused, nothing was run",
                    fix=f"check the fingerprint with the node's admin, then run: taehv-console trust {name}",
                    seconds=0.08,
                )
            )
        elif i == 14:
            out.append(
                ProbeResult(
                    name,
                    error=f"{name}: connection timed out after 10 s",
                    fix="check that the node is up and reachable from this one",
                    seconds=10.0,
                )
            )
        else:
            out.append(ProbeResult(name, facts(i), seconds=round(0.6 + 0.05 * i, 2), clock_offset_s=0.002))
    return tuple(out)


def report(n_nodes: int) -> PreflightReport:
    findings = [
        Finding("nccl-env", Severity.INFO, "NCCL_DEBUG=WARN set for the run: warnings reach the node logs")
    ]
    if n_nodes > 1:
        findings = [
            Finding(
                "unreachable",
                Severity.ERROR,
                f"{node_name(14)}: connection timed out after 10 s",
                fix="check that the node is up and reachable from this one",
                node=node_name(14),
            ),
            Finding(
                "host-key-unknown",
                Severity.ERROR,
                f"{node_name(9)}: host key not in ~/.ssh/known_hosts",
                fix=f"taehv-console trust {node_name(9)}",
                node=node_name(9),
            ),
            Finding(
                "clock-skew",
                Severity.WARNING,
                f"{node_name(3)}: clock 2.4 s ahead of this node",
                fix="enable NTP (chronyd) on every node: heartbeat ages would read wrong",
                node=node_name(3),
            ),
            Finding(
                "bandwidth-low",
                Severity.WARNING,
                "measured 9.1 Gbit/s between nodes; the plan assumes 25Gbit",
                fix="use the InfiniBand interface (NCCL_SOCKET_IFNAME / NCCL_IB_HCA) or plan with --bandwidth",
            ),
            *findings,
        ]
    return PreflightReport(topology(n_nodes), probes(n_nodes), tuple(findings))
