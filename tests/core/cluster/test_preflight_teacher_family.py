"""Preflight checks the teacher against the run's family on every node: nodecheck `teacher` gets the
family (and a `custom` student's scales), so a teacher of another family is a teacher-unusable error
naming the family that fits it, and a right one says what its test clip of the family gives. One node,
as inside a platform pod (no SSH); tiny random teachers of the real diffusers classes."""

from __future__ import annotations

import pytest

from taehv_console.core.cluster.platform import detect_topology
from taehv_console.core.cluster.preflight import PreflightOptions, run_preflight
from taehv_console.core.plan.presets import load_preset
from tests.trainer.conftest import save_tiny_wan
from tests.trainer.teachers import save_tiny_wan22

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _teacher_findings(tmp_path, family: str, teacher) -> dict[str, str]:
    cfg = load_preset(
        "cpu-smoke", overrides=["topology.nodes=1", f"model.family={family}", f'loss.teacher="{teacher}"']
    ).config
    topo = detect_topology(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "23456", "WORLD_SIZE": "1", "RANK": "0"}, local_gpus=None
    )
    report = run_preflight(
        topo,
        cfg,
        options=PreflightOptions(
            runs_dir=str(tmp_path / "runs"), data_source=str(tmp_path), loader_clips=0, video_scan_s=0
        ),
    )
    return {f.id: f"{f.message} | {f.fix}" for f in report.findings if f.id.startswith("teacher-")}


def test_preflight_refuses_a_teacher_of_another_family_and_names_the_one_it_fits(tmp_path):
    wan21, wan22 = save_tiny_wan(tmp_path / "wan21"), save_tiny_wan22(tmp_path / "wan22")
    found = _teacher_findings(tmp_path, "taew2_2", wan21)
    assert set(found) == {"teacher-unusable"}, found
    text = found["teacher-unusable"]
    assert "model.family = taew2_2 needs AutoencoderKLWan, 48 latent channels, 16x space" in text
    assert "it fits model.family = taew2_1" in text and "a diffusers AutoencoderKLWan directory" in text

    found = _teacher_findings(tmp_path, "taew2_2", wan22)
    assert set(found) == {"teacher-ok"}, found
    assert "model.family = taew2_2's; a 8-frame 32x32 clip gives latents 2x48x2x2" in found["teacher-ok"]
