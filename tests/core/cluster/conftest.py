"""Recorded node data for the cluster tests: NVML readings of real GPU models (recorded/*.json, the
shape probe.read_nvml returns) and NodeFacts built from them, so checks are tested on machines
without GPUs exactly as they would run on a cluster."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from taehv_console.core.cluster.probe import gpus_from_nvml, resolve_visible_devices
from taehv_console.core.models import NetInterface, NodeFacts, PathInfo

RECORDED = Path(__file__).parent / "recorded"
NVML = {
    "h100": "nvml_8x_h100_80gb_550.json",
    "a800": "nvml_8x_a800_80gb_535.json",
    "a100-40": "nvml_8x_a100_40gb_550.json",
    "none": "nvml_no_library.json",
    "no-driver": "nvml_driver_not_loaded.json",
}


def load_nvml(kind: str) -> dict:
    return json.loads((RECORDED / NVML[kind]).read_text())


def build_facts(
    host: str,
    nvml: str = "h100",
    *,
    cvd: str | None = None,
    runs_free_gb: float = 500.0,
    data_exists: bool = True,
    **changes,
) -> NodeFacts:
    """A node as the probe would report it on a typical GPU server (Ubuntu, Python 3.11, pip torch)."""
    gpus, reason, driver, cuda = gpus_from_nvml(load_nvml(nvml))
    visible, invalid = resolve_visible_devices(cvd, gpus)
    facts = NodeFacts(
        hostname=host,
        addresses=("10.0.0.1",),
        gpus=gpus,
        gpu_reason=reason,
        driver_version=driver,
        cuda_driver_version=cuda,
        cuda_visible_devices=cvd,
        visible_gpu_indices=visible,
        invalid_visible_entries=invalid,
        cpu_count=96,
        ram_gb=2015.6,
        paths=(
            PathInfo("runs", "/shared/runs", True, True, True, True, runs_free_gb, 10000.0, "/shared"),
            PathInfo(
                "data",
                "/shared/videos",
                data_exists,
                data_exists,
                True,
                data_exists,
                9000.0,
                10000.0,
                "/shared",
            ),
        ),
        python_version="3.11.9",
        python_executable="/opt/venv/bin/python",
        torch_version="2.5.1+cu124" if gpus else "2.5.1+cpu",
        torch_cuda_version="12.4" if gpus else None,
        nccl_version="2.21.5" if gpus else None,
        deepspeed_version="0.16.2",
        accelerate_version="1.2.1",
        taehv_console_version="0.1.0",
        ib_devices=("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3") if gpus else (),
        interfaces=(
            NetInterface("lo", ("127.0.0.1",)),
            NetInterface("eth0", ("10.0.0.1",)),
            NetInterface("ib0", ("192.168.0.1",)),
        ),
        clock=1_700_000_000.0,
    )
    return replace(facts, **changes)


@pytest.fixture
def nvml_reading():
    return load_nvml


@pytest.fixture
def make_facts():
    return build_facts
