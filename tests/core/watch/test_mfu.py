"""MFU, the users' oldest complaint made visible: trainer/flops.py's figure against what the H100
measured, and a run's `mfu` (the step event's) in every front end, marked low below LOW_MFU."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from taehv_console.core.watch.monitor import snapshot_once
from taehv_console.core.watch.view import headline, progress_dict
from taehv_console.follow import JsonView, PlainView
from taehv_console.ui import formatting as f
from taehv_console.ui.widgets.run_header import _mfu, header_content
from tests.ui.test_one_view import RECORDED, _snap
from trainer.flops import LOW_MFU, datasheet_peak, mfu


def test_mfu_is_what_the_h100_benchmark_measured():
    """benchmarks/gpu_throughput.py on one H100 SXM (docs/performance.md): the trainer at 33.4
    clips/s of 12x480x720 was 20.6 % MFU, the 64x64 crop recipe at 2,413 clips/s 17.6 %, when a step
    was FACTS' 6.1 TFLOP; trainer/flops.py now counts the layers the trainer runs (5.73 TFLOP: the
    decoder's last convolutions on the 9 frames it keeps), 6 % less: 19.4 % and 16.5 %."""
    peak, source = datasheet_peak("NVIDIA H100 80GB HBM3")
    assert peak == 989 and "SXM" in source
    assert mfu(33.4, 12, 480, 720, 1, peak) == pytest.approx(0.194, abs=0.001)
    assert mfu(2413, 12, 64, 64, 1, peak) == pytest.approx(0.165, abs=0.001)
    # per GPU: 8 GPUs at 8 x 33.4 clips/s are as busy as one at 33.4
    assert mfu(8 * 33.4, 12, 480, 720, 8, peak) == pytest.approx(mfu(33.4, 12, 480, 720, 1, peak))
    # decoding the teacher's latents too is ~1.7x the work per clip
    assert mfu(10, 12, 480, 720, 1, peak, teacher_decode=True) == pytest.approx(
        1.67 * mfu(10, 12, 480, 720, 1, peak), rel=0.01
    )
    # the run's family: a patch-2 student does a quarter of the work per clip
    assert mfu(10, 12, 480, 720, 1, peak, model="taew2_2") == pytest.approx(
        mfu(10, 12, 480, 720, 1, peak) / 4, rel=0.05
    )


def _run_with_mfu(tmp_path: Path, value: float | None) -> Path:
    """The recorded cpu-smoke run, its last step event carrying `mfu` as a GPU rank writes it."""
    run = tmp_path / RECORDED.name
    shutil.copytree(RECORDED, run)
    events = run / "events" / "rank-0.jsonl"
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    last_step = max(i for i, e in enumerate(lines) if e["kind"] == "step")
    if value is not None:
        lines[last_step]["mfu"] = value
    events.write_text("".join(json.dumps(e) + "\n" for e in lines))
    return run


@pytest.mark.parametrize(("value", "low"), [(0.035, True), (0.206, False)])
def test_every_front_end_shows_the_runs_mfu_and_marks_a_crawl(tmp_path, value, low):
    view = snapshot_once(_run_with_mfu(tmp_path, value))
    assert view.run.mfu == value
    text = f"{100 * value:.1f} %"
    h = headline(view)
    assert h.mfu == text and h.slow is low and (value < LOW_MFU) is low
    assert f"mfu {text}{' (low)' if low else ''} " in h.text
    out = io.StringIO()
    PlainView(out, every_s=0).update(_snap(view), view)
    assert h.text in out.getvalue()
    out = io.StringIO()
    JsonView(out).update(_snap(view), view)
    phase = next(o for o in map(json.loads, out.getvalue().splitlines()) if o["kind"] == "phase")
    assert phase["progress"]["mfu"] == value == progress_dict(view)["mfu"]
    assert f"MFU {text}" in header_content(view).plain
    (value_part,) = [part for part in _mfu(value) if getattr(part, "plain", None) == text]
    styles = {str(span.style) for span in value_part.spans}
    assert styles == ({f.health_style("warning")} if low else {"bold"})


def test_a_run_without_mfu_shows_none(tmp_path):
    """On CPU (the recording) the trainer writes no `mfu`: nothing is shown, nothing is made up."""
    view = snapshot_once(_run_with_mfu(tmp_path, None))
    assert view.run.mfu is None and headline(view).mfu == ""
    assert "mfu" not in headline(view).text and "MFU" not in header_content(view).plain
    assert progress_dict(view)["mfu"] is None
