"""Preflight opens every video once (issue 44: a --data folder with a truncated and a zero-byte
mp4 passed with 0 warnings and no file named): each node's scan decodes the first frame of each
video within a time budget, and names the unreadable ones, how many and the first few paths; a
warning while readable ones remain, an error when none are, a note when the budget cut it short."""

from __future__ import annotations

import json

import pytest

from taehv_console import cli
from taehv_console.core.cluster.nodecheck import scan_videos
from taehv_console.core.cluster.preflight.data import check_videos
from taehv_console.core.models import Severity
from trainer.config import DataSection
from trainer.synthetic import make_synthetic


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("videos")
    make_synthetic(folder, clips=2, frames=12, height=64, width=64, seed=0)
    good = min(folder.glob("*.mp4"))
    (folder / "truncated.mp4").write_bytes(good.read_bytes()[:3000])
    (folder / "empty.mp4").write_bytes(b"")
    return folder


def scan(folder, budget=20.0):
    return scan_videos(DataSection(source=str(folder)).model_dump_json(), budget)


def test_the_scan_names_a_truncated_and_an_empty_video(videos):
    s = scan(videos)
    assert (s["videos"], s["scanned"], s["readable"], s["unreadable"]) == (4, 4, 2, 2)
    named = {v["path"].rsplit("/", 1)[1]: v["why"] for v in s["named"]}
    assert named["empty.mp4"] == "empty file (0 bytes)"
    assert "Invalid data" in named["truncated.mp4"]


def test_unreadable_videos_beside_readable_ones_are_a_warning_naming_them(videos):
    (finding,) = check_videos({"node-a": scan(videos)})
    assert finding.id == "videos-unreadable" and finding.severity is Severity.WARNING
    assert finding.message.startswith("node-a: 2 of 4 video(s) scanned give no frame, training skips them: ")
    assert "empty.mp4 (empty file (0 bytes))" in finding.message and "truncated.mp4 (" in finding.message


def test_no_readable_video_is_an_error(tmp_path):
    for i in range(7):
        (tmp_path / f"bad-{i}.mp4").write_bytes(b"not a video" * i)
    (finding,) = check_videos({"node-a": scan(tmp_path)})
    assert (
        finding.severity is Severity.ERROR
        and "7 of 7 video(s) scanned give no frame: none is readable" in finding.message
    )
    assert finding.message.endswith(" and 2 more")  # the first five by path, the rest counted


def test_a_scan_cut_short_by_its_budget_says_how_far_it_got(videos):
    s = scan(videos, budget=0.0)  # the first video is opened, then the budget is spent
    findings = check_videos({"node-a": s})
    (note,) = [f for f in findings if f.id == "videos-scan-partial"]
    assert note.severity is Severity.INFO and f"scanned {s['scanned']} of 4 videos" in note.message


def test_preflight_names_the_unreadable_videos_of_a_data_folder(videos, tmp_path, capsys):
    code = cli.main(["preflight", "--data", str(videos), "--runs", str(tmp_path / "runs"), "--json"])
    report = json.loads(capsys.readouterr().out)
    (finding,) = [f for f in report["findings"] if f["id"] == "videos-unreadable"]
    assert finding["severity"] == "warning" and "empty.mp4" in finding["message"] and code == 0
