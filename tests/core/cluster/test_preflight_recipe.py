"""Preflight checks the author's recipe on every node over SSH (real sshd on loopback): the teacher
VAE loads and gives the student's latent shape, or the error names the node and the path; a latent
cache is there and finished."""

from __future__ import annotations

import shutil
import socket

import pytest

from taehv_console.core.cluster.platform import detect_topology
from taehv_console.core.cluster.preflight import PreflightOptions, run_preflight
from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.plan.presets import load_preset
from tests.trainer.conftest import save_tiny_teacher

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def _preflight(sshd, tmp_path, *overrides):
    hf = sshd.write_hostfile(tmp_path / "hostfile", slots=1, hosts=sshd.addresses[:2])
    cfg = load_preset(
        "cpu-smoke",
        overrides=[
            "topology.nodes=2",
            "topology.gpus_per_node=1",
            'distributed.nccl_env={GLOO_SOCKET_IFNAME="lo"}',
            *overrides,
        ],
    ).config
    with SshPool(sshd.settings()) as pool:
        return run_preflight(
            detect_topology({}, hf),
            cfg,
            pool,
            PreflightOptions(
                runs_dir=str(tmp_path / "runs"), data_source=str(tmp_path), master_port=_free_port()
            ),
        )


def test_teacher_checked_on_every_node(sshd, tmp_path, monkeypatch):
    for k, v in sshd.env().items():
        monkeypatch.setenv(k, v)
    good = save_tiny_teacher(tmp_path / "teacher")
    report = _preflight(sshd, tmp_path, f'loss.teacher="{good}"')
    ok = {f.node: f.message for f in report.findings if f.id == "teacher-ok"}
    assert set(ok) == set(sshd.addresses[:2]), [f.message for f in report.findings]
    assert all("2x16x2x2" in m for m in ok.values())

    corrupt = tmp_path / "corrupt"
    shutil.copytree(good, corrupt)
    weights = next(corrupt.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    report = _preflight(sshd, tmp_path, f'loss.teacher="{corrupt}"')
    bad = [f for f in report.errors if f.id == "teacher-unusable"]
    assert sorted(f.node for f in bad) == sorted(sshd.addresses[:2])
    for f in bad:  # the node and the path, in the message the user reads
        assert f.message.startswith(f"{f.node}: ") and str(corrupt) in f.message and f.fix
    assert not report.ok

    report = _preflight(sshd, tmp_path, f'loss.teacher_cache="{tmp_path / "no-cache"}"')
    missing = [f for f in report.errors if f.id == "teacher-unusable"]
    assert len(missing) == 2 and all("cache-latents" in f.message for f in missing)
