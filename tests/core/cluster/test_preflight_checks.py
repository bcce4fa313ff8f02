"""Preflight checks as pure functions over recorded node facts: each test builds the situation a
real cluster would report and asserts the finding (or its absence)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from taehv_console.core.cluster import preflight as pf
from taehv_console.core.cluster.bandwidth import bus_bandwidth, result_from_timing
from taehv_console.core.models import NodeSpec, ProbeResult, Severity, Topology, TopologySource
from trainer.config import TrainConfig, config_from_dict


def cfg(nodes=2, ppn=8, device="cuda", **sections) -> TrainConfig:
    data = {"topology": {"nodes": nodes, "gpus_per_node": ppn, "device": device, "gpu_memory_gb": 80}}
    data.update(sections)
    return config_from_dict(data)


def hostfile_topology(*hosts_slots) -> Topology:
    nodes = tuple(NodeSpec(h, i, s) for i, (h, s) in enumerate(hosts_slots))
    return Topology(TopologySource.HOSTFILE, len(nodes), nodes, master_addr=nodes[0].host)


def ids(findings, severity=None):
    return [f.id for f in findings if severity is None or f.severity is severity]


def test_two_by_eight_run_as_one_by_sixteen_is_an_error_naming_the_fix(make_facts):
    topo = hostfile_topology(("gpu01", 8), ("gpu02", 8))
    facts = {"gpu01": make_facts("gpu01"), "gpu02": make_facts("gpu02")}
    out = pf.check_processes_vs_gpus(topo, facts, cfg(nodes=1, ppn=16))
    [f] = [f for f in out if f.id == "topology-mismatch"]
    assert f.severity is Severity.ERROR
    assert "1 node(s) × 16" in f.message and "2 node(s) × 8 GPUs" in f.message
    assert "invalid device ordinal" in f.message
    assert "2 nodes × 8" in f.fix and "machine ranks 0 and 1" in f.fix
    assert "--set topology.nodes=2 --set topology.gpus_per_node=8" in f.fix


def test_matching_topology_has_no_error(make_facts):
    topo = hostfile_topology(("gpu01", 8), ("gpu02", 8))
    facts = {"gpu01": make_facts("gpu01"), "gpu02": make_facts("gpu02")}
    assert ids(pf.check_processes_vs_gpus(topo, facts, cfg()), Severity.ERROR) == []


def test_platform_topology_with_one_probed_node_still_catches_the_mismatch(make_facts):
    # PAI: only this pod is probed; its 8 GPUs stand for every pod.
    topo = Topology(TopologySource.PAI_DLC, 2, (), this_node_rank=0, master_addr="m")
    out = pf.check_processes_vs_gpus(topo, {"localhost": make_facts("pod0")}, cfg(nodes=1, ppn=16))
    assert ids(out) == ["topology-mismatch"]


def test_hostfile_slots_beyond_gpus_and_processes_beyond_gpus(make_facts):
    topo = hostfile_topology(("gpu01", 8), ("gpu02", 16))
    facts = {"gpu01": make_facts("gpu01"), "gpu02": make_facts("gpu02", cvd="0,1,2,3")}
    out = pf.check_processes_vs_gpus(topo, facts, cfg())
    slots = [f for f in out if f.id == "slots-exceed-devices"]
    assert [(f.node, f.severity) for f in slots] == [("gpu02", Severity.ERROR)]
    assert "slots=16" in slots[0].message and "4 GPU(s)" in slots[0].message
    assert "gpu02 slots=4" in slots[0].fix
    assert [f.node for f in out if f.id == "processes-exceed-gpus"] == ["gpu02"]


def test_zero_gpus_is_an_error_with_the_probe_reason(make_facts):
    topo = hostfile_topology(("gpu01", 8))
    out = pf.check_processes_vs_gpus(topo, {"gpu01": make_facts("gpu01", "no-driver")}, cfg(nodes=1))
    [f] = out  # one finding: no "slots exceed 0 GPUs, set slots=0" on top of it
    assert f.id == "no-gpu" and "Driver Not Loaded" in f.message and "topology.device=cpu" in f.fix


def test_cpu_run_slots_count_cpus(make_facts):
    topo = hostfile_topology(("n1", 200))
    out = pf.check_processes_vs_gpus(
        topo, {"n1": make_facts("n1", "none")}, cfg(nodes=1, ppn=2, device="cpu")
    )
    assert ids(out, Severity.ERROR) == ["slots-exceed-devices"]
    assert "96 CPU(s)" in out[0].message


def test_visible_device_ordinals_beyond_the_count(make_facts):
    out = pf.check_visible_devices(
        {"gpu01": make_facts("gpu01", cvd="0,1,8,9"), "gpu02": make_facts("gpu02")}
    )
    [f] = out
    assert (f.id, f.node, f.severity) == ("visible-devices-invalid", "gpu01", Severity.ERROR)
    assert "'8,9'" in f.message and "shows 2 GPU(s)" in f.message and "0–7" in f.fix


def test_mixed_gpu_models_and_memory_warn(make_facts):
    same = pf.check_gpu_homogeneity({"a": make_facts("a"), "b": make_facts("b")})
    assert same == []
    out = pf.check_gpu_homogeneity({"a": make_facts("a"), "b": make_facts("b", "a100-40")})
    assert sorted(ids(out, Severity.WARNING)) == ["gpu-memory-differs", "gpu-models-differ"]
    assert "40 GB" in next(f for f in out if f.id == "gpu-memory-differs").message


def test_version_skew(make_facts):
    a, b = make_facts("a"), make_facts("b")
    assert pf.check_version_skew({"a": a, "b": b}) == []
    out = pf.check_version_skew(
        {
            "a": a,
            "b": replace(
                b, torch_version="2.4.0+cu121", python_version="3.10.12", driver_version="535.129.03"
            ),
        }
    )
    msgs = {f.message.split(" differs")[0]: f.severity for f in out}
    assert msgs == {"torch": Severity.ERROR, "Python": Severity.ERROR, "NVIDIA driver": Severity.WARNING}
    # a patch release of Python is no skew
    assert pf.check_version_skew({"a": a, "b": replace(b, python_version="3.11.4")}) == []
    missing = pf.check_version_skew({"a": replace(a, deepspeed_version=None)})
    assert ids(missing) == ["package-missing"] and "deepspeed" in missing[0].message


def test_data_source_missing_on_one_node(make_facts):
    out = pf.check_data({"a": make_facts("a"), "b": make_facts("b", data_exists=False)}, "/shared/videos")
    assert [(f.id, f.node) for f in out] == [("data-missing", "b")]
    assert ids(pf.check_data({}, ""), Severity.WARNING) == ["data-not-set"]


def test_runs_dir_not_shared_warns_about_checkpoints():
    out = pf.check_runs_shared({"b": True, "c": False}, "/runs", "a")
    [f] = out
    assert f.severity is Severity.WARNING and f.id == "runs-not-shared" and "c" in f.message
    assert "checkpoint" in f.message and "shared" in f.fix
    assert ids(pf.check_runs_shared({"b": True}, "/runs", "a")) == ["runs-shared"]
    assert pf.check_runs_shared(None, "/runs") == []


def test_disk_for_kept_checkpoints(make_facts):
    c = cfg(schedule={"keep_checkpoints": 3})
    per = pf.checkpoint_bytes(c)
    assert 170e6 < per < 200e6  # 11.3M parameters × 16 bytes
    assert pf.check_disk({"a": make_facts("a")}, c) == []
    out = pf.check_disk({"a": make_facts("a", runs_free_gb=0.3)}, c)
    assert ids(out, Severity.ERROR) == ["disk-too-small"] and "keep_checkpoints" in out[0].fix
    assert ids(pf.check_disk({"a": make_facts("a", runs_free_gb=1.0)}, c)) == ["disk-tight"]


def test_master_port_busy_and_unreachable():
    busy = pf.check_master_port(29500, "gpu01", (False, "Address already in use"), {})
    assert ids(busy, Severity.ERROR) == ["master-port-busy"]
    out = pf.check_master_port(
        29500, "gpu01", (True, ""), {"gpu02": (True, ""), "gpu03": (False, "timed out")}
    )
    assert [(f.id, f.node) for f in out] == [("master-port-unreachable", "gpu03")]
    assert "29500" in out[0].fix


def test_a_taken_port_is_no_error_for_one_node():
    # accelerate launches one machine standalone on a free port when its own is taken
    out = pf.check_master_port(29500, "gpu01", (False, "Address already in use"), {}, one_node=True)
    assert ids(out, Severity.INFO) == ["master-port-taken"] and ids(out, Severity.ERROR) == []
    assert "29500" in out[0].message and "Address already in use" in out[0].message
    assert pf.check_master_port(29500, "gpu01", (True, ""), {}, one_node=True) == []


@pytest.mark.parametrize(
    "offsets, flagged",
    [
        ((0.0, 0.0, 0.3), False),
        ((0.0, 1.9, -0.05), False),
        ((0.0, 2.5, 0.0), True),
        ((-1.5, 1.5, 0.0), True),  # each within 2 s of us, 3 s apart from each other
    ],
)
def test_clock_skew_beyond_two_seconds(offsets, flagged):
    probes = [ProbeResult(f"n{i}", clock_offset_s=o) for i, o in enumerate(offsets)]
    assert bool(pf.check_clock_skew(probes)) is flagged


@pytest.mark.parametrize(
    "nvml, node_env, nccl_env, expect",
    [
        ("none", {}, {"NCCL_IB_DISABLE": "0"}, [("nccl-ib-missing", Severity.WARNING)]),
        ("none", {"NCCL_IB_HCA": "mlx5_0"}, {}, [("nccl-ib-missing", Severity.WARNING)]),
        ("none", {}, {"NCCL_NET": "IB"}, [("nccl-ib-missing", Severity.ERROR)]),
        ("none", {"NCCL_IB_DISABLE": "0"}, {"NCCL_IB_DISABLE": "1"}, []),  # the config's value wins
        ("h100", {}, {"NCCL_IB_HCA": "mlx5_0,mlx5_1:1"}, []),
        ("h100", {}, {"NCCL_IB_HCA": "=mlx5_9"}, [("nccl-ib-hca-missing", Severity.ERROR)]),
        ("h100", {}, {"NCCL_SOCKET_IFNAME": "eth"}, []),  # prefix match
        ("h100", {}, {"NCCL_SOCKET_IFNAME": "=eth"}, [("socket-ifname-missing", Severity.ERROR)]),
        ("h100", {"NCCL_SOCKET_IFNAME": "bond0"}, {}, [("socket-ifname-missing", Severity.ERROR)]),
        ("h100", {}, {"NCCL_SOCKET_IFNAME": "^docker,lo"}, []),
        ("h100", {}, {"GLOO_SOCKET_IFNAME": "ens5"}, [("socket-ifname-missing", Severity.ERROR)]),
    ],
)
def test_nccl_env_against_hardware(make_facts, nvml, node_env, nccl_env, expect):
    # "none" stands for a node without GPUs or InfiniBand (ib_devices empty in the recorded facts)
    f = make_facts("n1", nvml, comm_env=tuple(node_env.items()))
    out = pf.check_nccl_env({"n1": f}, nccl_env)
    assert [(x.id, x.severity) for x in out] == expect


def test_socket_ifname_error_lists_real_interfaces(make_facts):
    [f] = pf.check_nccl_env({"n1": make_facts("n1")}, {"NCCL_SOCKET_IFNAME": "enp1s0"})
    assert "eth0" in f.fix and "ib0" in f.fix and f.node == "n1"


def test_compiling_under_zero3_is_a_warning_with_both_ways_out():
    from taehv_console.core.plan.presets import load_preset

    shipped = load_preset("16gpu-h100").config  # published ZeRO-3, compiled as every GPU preset
    [f] = pf.check_compile(shipped)
    assert (f.id, f.severity) == ("compile-under-zero3", Severity.WARNING)
    assert "graph breaks" in f.message
    assert "--set deepspeed.zero_stage=2" in f.fix and "--set model.compile=false" in f.fix
    # either way out leaves nothing to say, and so does ZeRO-2 compiled
    assert pf.check_compile(cfg(deepspeed={"zero_stage": 2}, model={"compile": True})) == []
    assert pf.check_compile(cfg(deepspeed={"zero_stage": 3}, model={"compile": False})) == []


def test_memory_fit_uses_the_real_gpu_memory(make_facts):
    c = cfg(optim={"batch_per_gpu": 8})
    fits = pf.check_memory_fit(c, {"a": make_facts("a")})
    assert "memory-fit" in ids(fits) and not ids(fits, Severity.ERROR)
    small = pf.check_memory_fit(c, {"a": make_facts("a", "a100-40")})
    assert "gpu-memory-smaller" in ids(small, Severity.WARNING)
    # same config on 40 GB cards: ~47 GB per GPU fits 80 GB but not the 42.9 GB really there
    [err] = [f for f in small if f.id == "memory-does-not-fit"]
    # the fix names the planner's largest batch for the memory really there, below the asked 8
    from taehv_console.core.plan.planner import estimate_memory

    real = c.model_copy(update={"topology": c.topology.model_copy(update={"gpu_memory_gb": 42.9})})
    best = estimate_memory(real).max_batch_per_gpu
    assert "42.9 GB available" in err.message and 1 <= best < 8 and f"batch_per_gpu to {best}" in err.fix
    huge = pf.check_memory_fit(cfg(optim={"batch_per_gpu": 64}), {"a": make_facts("a")})
    [err] = [f for f in huge if f.id == "memory-does-not-fit"]
    assert "batch_per_gpu" in err.fix


def test_cpu_processes_must_fit_in_the_node_ram(make_facts):
    c = cfg(
        nodes=1,
        ppn=4,
        device="cpu",
        data={"frames": 8, "height": 64, "width": 64},
        deepspeed={"reduce_bucket_size": 20_000_000, "allgather_bucket_size": 20_000_000},
    )
    assert ids(pf.check_memory_fit(c, {"n": make_facts("n", "none")}), Severity.ERROR) == []
    out = pf.check_memory_fit(c, {"n": make_facts("n", "none", ram_gb=1.5)})
    assert [(f.id, f.node) for f in out if f.severity is Severity.ERROR] == [("ram-too-small", "n")]


def test_bus_bandwidth_formula_and_finding():
    assert bus_bandwidth(10.0, 2) == pytest.approx(10.0)
    assert bus_bandwidth(10.0, 8) == pytest.approx(17.5)
    assert bus_bandwidth(10.0, 1) == 0.0
    r = result_from_timing("gloo", 4, 100_000_000, 5, 0.05)
    assert r.algbw_gbps == pytest.approx(2.0) and r.busbw_gbps == pytest.approx(3.0)
    assert pf.bandwidth_finding(r, assumed_gbps=10).id == "bandwidth"
    low = pf.bandwidth_finding(r, assumed_gbps=100)
    assert low.id == "bandwidth-low" and low.severity is Severity.WARNING and "24%" in low.message


def test_findings_sort_errors_first():
    a = pf.Finding("x", Severity.INFO, "m")
    b = pf.Finding("y", Severity.ERROR, "m")
    c = pf.Finding("z", Severity.WARNING, "m")
    assert [f.severity for f in pf.sort_findings([a, b, c])] == [
        Severity.ERROR,
        Severity.WARNING,
        Severity.INFO,
    ]


# ---------------------------------------------------------------------------------------- loader


def _loader(name: str) -> dict:
    # nodecheck `loader` output recorded on this project's dev machine (synthetic H.264 clips)
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parent / "recorded" / f"loader_{name}.json").read_text())


def test_loader_fast_enough_is_info_and_too_slow_names_the_workers_that_would_do(make_facts):
    fast, slow = _loader("480p_h264"), _loader("1080p_h264")
    c = cfg(nodes=2, ppn=8, data={"num_workers": 6})
    facts = {"gpu01": make_facts("gpu01"), "gpu02": make_facts("gpu02")}
    out = pf.check_loader({"gpu01": fast, "gpu02": slow}, c, {"gpu01": 50.0, "gpu02": 50.0}, facts)
    [ok] = [f for f in out if f.node == "gpu01"]
    assert ok.id == "loader-ok" and ok.severity is Severity.INFO and "h264 480x854" in ok.message
    [warn] = [f for f in out if f.node == "gpu02"]
    assert warn.id == "loader-too-slow" and warn.severity is Severity.WARNING
    need = -(-50.0 * slow["load_cpu_s"] // 1)  # ceil
    assert f"--set data.num_workers={int(need)}" in warn.fix
    assert f"{slow['load_cpu_s']:.3f} CPU-s per 12x480x720 clip" in warn.message
    assert "6 worker(s) per GPU give" in warn.message and "assumes 50.0 clips/s per GPU" in warn.message


def test_loader_needing_more_cores_than_the_node_has_says_so(make_facts):
    slow = _loader("1080p_h264")
    facts = {"gpu01": replace(make_facts("gpu01"), cpu_count=32)}
    [f] = pf.check_loader({"gpu01": slow}, cfg(nodes=1, ppn=8), {"gpu01": 65.0}, facts)
    assert f.id == "loader-too-slow" and "gpu01 has 32 CPUs" in f.fix


def test_loader_failures_data_error_stops_other_failure_warns():
    c = cfg(nodes=2, ppn=8)
    out = pf.check_loader(
        {
            "gpu01": {
                "ok": False,
                "data_error": True,
                "error": "3 videos in a row gave no clip: a.mp4 (too short)",
            },
            "gpu02": {"ok": False, "error": "timed out after 180 s"},
        },
        c,
        {"gpu01": 65.0, "gpu02": 65.0},
    )
    assert [(f.id, f.severity, f.node) for f in out] == [
        ("data-gives-no-clips", Severity.ERROR, "gpu01"),
        ("loader-not-measured", Severity.WARNING, "gpu02"),
    ]
    assert "a.mp4 (too short)" in out[0].message and "timed out" in out[1].message


def test_loader_skipped_videos_in_the_sample_are_reported():
    m = {
        **_loader("480p_h264"),
        "skipped": ["/v/small.mp4: frames of 240x320 are smaller than the 480x720 crop"],
    }
    out = pf.check_loader({"gpu01": m}, cfg(nodes=1, ppn=8), {"gpu01": 1.0})
    assert ids(out) == ["loader-ok", "loader-skipped-videos"] and "small.mp4" in out[1].message
