"""The node probe: NVML readings (recorded) to GPU facts, CUDA_VISIBLE_DEVICES as CUDA reads it,
no GPU as a normal answer, and the module's JSON output from a real subprocess."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from taehv_console.core.cluster.probe import gpus_from_nvml, probe_node, resolve_visible_devices
from taehv_console.core.models import NodeFacts


def test_eight_h100_reading_gives_eight_80gb_gpus_and_versions(nvml_reading):
    gpus, reason, driver, cuda = gpus_from_nvml(nvml_reading("h100"))
    assert len(gpus) == 8 and reason == ""
    assert {g.name for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert gpus[0].memory_total_mb == 81559  # 85520809984 bytes, what NVML reports for H100 SXM
    assert driver == "550.54.15" and cuda == "12.4"  # NVML encodes CUDA 12.4 as 12040
    assert [g.index for g in gpus] == list(range(8))


@pytest.mark.parametrize(
    "kind, words", [("none", "Shared Library Not Found"), ("no-driver", "Driver Not Loaded")]
)
def test_missing_nvml_is_zero_gpus_with_the_reason(nvml_reading, kind, words):
    gpus, reason, driver, cuda = gpus_from_nvml(nvml_reading(kind))
    assert gpus == () and words in reason and driver == "" and cuda == ""


H100_UUID3 = "GPU-7e6d5c4b-3a29-1807-f6e5-d4c3b2a19087"


@pytest.mark.parametrize(
    "value, visible, invalid",
    [
        (None, tuple(range(8)), ()),
        ("0,1,2,3", (0, 1, 2, 3), ()),
        ("3,1", (3, 1), ()),
        ("", (), ()),  # empty: CUDA shows nothing
        ("0,8,1", (0,), ("8", "1")),  # CUDA stops at the first bad entry: "1" is lost too
        ("-1", (), ("-1",)),
        ("0,0", (0,), ("0",)),  # a repeat is invalid
        (" 2 , 5 ", (2, 5), ()),
        (H100_UUID3[:12], (3,), ()),  # unique UUID prefix
        ("GPU-", (), ("GPU-",)),  # ambiguous prefix
        ("GPU-00000000-dead", (), ("GPU-00000000-dead",)),
    ],
)
def test_cuda_visible_devices_as_cuda_reads_it(nvml_reading, value, visible, invalid):
    gpus, *_ = gpus_from_nvml(nvml_reading("h100"))
    assert resolve_visible_devices(value, gpus) == (visible, invalid)


def test_probe_node_on_recorded_gpus_and_fake_sysfs(nvml_reading, tmp_path):
    (tmp_path / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    (tmp_path / "class" / "infiniband" / "mlx5_1").mkdir()
    data = tmp_path / "videos"
    data.mkdir()
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "NCCL_IB_HCA": "mlx5_0", "HOME": "/root", "SECRET_TOKEN": "x"}
    facts = probe_node(
        {"data": str(data), "runs": str(tmp_path / "runs" / "new")},
        env=env,
        nvml=lambda: nvml_reading("h100"),
        sys_root=str(tmp_path),
    )
    assert facts.gpu_count == 8 and facts.visible_gpu_indices == (4, 5, 6, 7)
    assert facts.ib_devices == ("mlx5_0", "mlx5_1")
    # Only the collective-related variables are recorded: never the whole environment.
    assert facts.comm_env == (("NCCL_IB_HCA", "mlx5_0"),)
    data_info, runs_info = facts.path("data"), facts.path("runs")
    assert data_info.exists and data_info.readable and data_info.is_dir
    assert not runs_info.exists and runs_info.writable and runs_info.fs_path == str(tmp_path)
    assert runs_info.free_gb is not None and runs_info.free_gb > 0


def test_probe_node_hiding_every_gpu_says_why(nvml_reading):
    facts = probe_node(env={"CUDA_VISIBLE_DEVICES": ""}, nvml=lambda: nvml_reading("h100"))
    assert facts.gpu_count == 8 and facts.visible_gpu_count == 0
    assert "hides every GPU" in facts.gpu_reason


def test_facts_survive_a_json_round_trip(make_facts):
    facts = make_facts("gpu01", cvd="0,1,9")
    again = NodeFacts.from_dict(json.loads(json.dumps(facts.to_dict())))
    assert again == facts


def test_from_dict_ignores_fields_a_newer_probe_adds(make_facts):
    d = make_facts("gpu01").to_dict()
    d["something_new"] = 1
    d["gpus"][0]["power_limit_w"] = 700
    assert NodeFacts.from_dict(d).gpus[0].name == "NVIDIA H100 80GB HBM3"


def test_probe_module_prints_json_without_importing_torch(tmp_path):
    # -X importtime lists every module imported; torch would cost seconds on every node.
    out = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "taehv_console.core.cluster.probe",
            "--path",
            f"runs={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    facts = NodeFacts.from_dict(json.loads(out.stdout))
    assert facts.path("runs").exists
    assert facts.python_executable == sys.executable
    # No GPU here: a normal answer with a reason, not a crash.
    if facts.gpu_count == 0:
        assert facts.gpu_reason
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines()}
    assert "torch" not in imported and "paramiko" not in imported
