"""A bad video in --data is named once, by one finding (issue 44): the scan's videos-unreadable
names it, and the loader's measure, in the same node call, samples only what the scan did not find
unreadable, so loader-skipped-videos no longer names the same file a second time. A folder with no
readable video is the scan's one error, not a second from the loader. Real videos, real preflight."""

from __future__ import annotations

import json

import pytest

from taehv_console import cli
from taehv_console.core.cluster.nodecheck import loader
from taehv_console.core.models import Severity
from trainer.config import DataSection
from trainer.synthetic import make_synthetic

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    good = tmp_path_factory.mktemp("mixed")
    make_synthetic(good, clips=1, frames=12, height=64, width=64, seed=0)
    clip = min(good.glob("*.mp4")).read_bytes()
    bad = tmp_path_factory.mktemp("bad")
    for folder in (good, bad):
        (folder / "truncated.mp4").write_bytes(clip[:3000])
        (folder / "empty.mp4").write_bytes(b"")
    return good, bad


def _preflight(folder, runs, capsys) -> tuple[int, list[dict]]:
    code = cli.main(["preflight", "--data", str(folder), "--runs", str(runs), "--json"])
    return code, json.loads(capsys.readouterr().out)["findings"]


@pytest.mark.parametrize("name", ["empty.mp4", "truncated.mp4"])
def test_each_bad_video_is_named_by_one_finding(folders, tmp_path, capsys, name):
    code, findings = _preflight(folders[0], tmp_path / "runs", capsys)
    naming = [f["id"] for f in findings if name in f["message"]]
    assert naming == ["videos-unreadable"], findings
    (finding,) = [f for f in findings if f["id"] == "videos-unreadable"]
    assert finding["message"].count(name) == 1 and finding["severity"] == "warning"
    assert "loader-skipped-videos" not in {f["id"] for f in findings}
    # the good one was measured
    assert code == 0 and {f["id"] for f in findings} >= {"loader-ok"}, findings


def test_a_folder_without_a_readable_video_is_one_error(folders, tmp_path, capsys):
    code, findings = _preflight(folders[1], tmp_path / "runs", capsys)
    errors = [f for f in findings if f["severity"] == Severity.ERROR.value]
    assert [f["id"] for f in errors] == ["videos-unreadable"], errors
    assert not [f for f in findings if f["id"].startswith(("loader-", "data-gives"))], findings
    assert code == 3  # preflight found an error: not ready to launch


def _section(folder) -> str:
    return DataSection(source=str(folder), frames=8, height=64, width=64).model_dump_json()


def test_the_loader_samples_only_what_the_scan_read(folders):
    section = _section(folders[0])
    scanned = loader(section, 3, scan_budget_s=20.0)
    assert scanned["ok"] and scanned["skipped"] == [] and scanned["scan"]["unreadable"] == 2
    assert loader(_section(folders[1]), 3, 20.0)["none_readable"] is True
    # without a scan nothing is known beforehand: the loader's own skip names what it sampled
    unscanned = loader(section, 8, scan_budget_s=0.0)
    assert "scan" not in unscanned and unscanned["ok"] and unscanned["skipped"], unscanned
    assert {s.split(": ", 1)[0].rsplit("/", 1)[1] for s in unscanned["skipped"]} <= {
        "empty.mp4",
        "truncated.mp4",
    }
