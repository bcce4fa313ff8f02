"""The real SLURM cluster fixture (tests/slurm/cluster.py), started once per session on first use."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.slurm.cluster import LoopbackSlurm, missing_binaries


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = missing_binaries()
    why = ""
    if missing:
        why = f"SLURM is not installed (missing {', '.join(missing)}): apt-get install slurm-wlm munge"
    elif os.geteuid() != 0:
        why = "the loopback SLURM cluster needs root (slurmd, and munged as user munge)"
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"{why}; on CI .ci/run installs SLURM and runs as root")
        pytest.skip(why)
    cluster = LoopbackSlurm()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        left = cluster.alive()
        shutil.rmtree(cluster.dir, ignore_errors=True)
        assert not left, f"SLURM daemons still running after the shutdown: {left}"
