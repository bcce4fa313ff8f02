"""Every front end renders the same RunView: built once from a recorded run directory (a real
2-rank cpu-smoke run's events, heartbeats, run.toml and state.json), the TUI's header and node
drill-down, --no-tui's plain and JSON lines and `status --json` agree field by field."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

from taehv_console.commands.status import run_info
from taehv_console.core.run.outcome import RunSnapshot
from taehv_console.core.run.rundir import RunDir
from taehv_console.core.run.state import Phase
from taehv_console.core.watch.monitor import snapshot_once
from taehv_console.core.watch.view import headline, progress_dict
from taehv_console.follow import JsonView, PlainView
from tests.ui.conftest import sample_app

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "cpu-smoke-done"


def _snap(view) -> RunSnapshot:
    return RunSnapshot(run_id=view.run.run_id, phase=Phase(view.run.console_phase), attempt=1, progress={})


def test_tui_headless_and_status_render_one_view_alike():
    asyncio.run(_agree())


async def _agree():
    from textual.widgets import DataTable

    from taehv_console.ui.screens.dashboard import DashboardScreen
    from taehv_console.ui.screens.node import NodeScreen
    from taehv_console.ui.widgets.run_header import RunHeaderBar

    view = snapshot_once(RECORDED)
    h = headline(view)
    assert (
        view.run.phase == "done" and view.run.step == 3 and view.run.max_steps == 3
    )  # the recording's facts

    # --no-tui, plain: the progress line is the headline, word for word
    out = io.StringIO()
    PlainView(out, every_s=0).update(_snap(view), view)
    plain = out.getvalue()
    assert h.text in plain and f"{view.run.run_id}: done" in plain

    # --no-tui --json: the phase line carries the same progress
    out = io.StringIO()
    JsonView(out).update(_snap(view), view)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    phase = next(o for o in lines if o["kind"] == "phase")
    assert phase["phase"] == view.run.phase and phase["progress"] == json.loads(
        json.dumps(progress_dict(view))
    )
    health = next(o for o in lines if o["kind"] == "health")
    assert [(r["rank"], r["state"], r["step"]) for r in health["ranks"]] == [
        (r.rank, r.state.value, r.step) for r in view.ranks
    ]

    # status --json: the same progress and per-rank health
    info = json.loads(json.dumps(run_info(RunDir(RECORDED), pool=None, check=False), default=str))
    assert {k: v for k, v in info["progress"].items() if k != "eta_s"} == {
        k: v for k, v in json.loads(json.dumps(progress_dict(view))).items() if k != "eta_s"
    }
    assert [(r["rank"], r["state"], r["step"], r["node"]) for r in info["ranks"]] == [
        (r.rank, r.state.value, r.step, r.node) for r in view.ranks
    ]

    # the TUI: its header shows each headline field as headless prints it, its node drill-down
    # each rank's state and step
    app = sample_app()
    async with app.run_test(size=(160, 50)) as pilot:
        app.cluster_state = view
        await app.push_screen(DashboardScreen())
        await pilot.pause()
        header = app.screen.query_one(RunHeaderBar).render()
        text = str(getattr(header, "plain", header))
        for name in ("phase", "step", "loss", "psnr", "clips_per_s", "eta"):
            assert getattr(h, name) in text, (name, getattr(h, name), text)
        await app.push_screen(NodeScreen(view.nodes[0].name))
        await pilot.pause()
        table = app.screen.query_one("#ranks", DataTable)
        rows = [[str(getattr(c, "plain", c)) for c in table.get_row_at(i)] for i in range(table.row_count)]
        assert [(int(r[0]), r[2]) for r in rows] == [(r.rank, str(r.step)) for r in view.ranks]
        assert all(r.state.value in row[1] for r, row in zip(view.ranks, rows))


def test_headless_and_status_name_the_newest_samples_once_per_validation(tmp_path, capsys):
    """A validation's samples (index.json written last) are named by --no-tui, plain and JSON, once
    per new step, and by `status`; a step still being written is not."""
    import shutil

    from taehv_console.cli import main
    from tests.sample_steps import write_sample_step

    run = tmp_path / RECORDED.name
    shutil.copytree(RECORDED, run)
    view = snapshot_once(run)
    plain_out, json_out = io.StringIO(), io.StringIO()
    plain, js = PlainView(plain_out, every_s=0), JsonView(json_out)

    def update() -> None:
        plain.update(_snap(view), view)
        js.update(_snap(view), view)

    def json_samples() -> list[dict]:
        return [o for o in map(json.loads, json_out.getvalue().splitlines()) if o["kind"] == "samples"]

    update()
    assert "samples" not in plain_out.getvalue() and json_samples() == []

    step_dir = write_sample_step(run, 10, clips=2)
    write_sample_step(run, 20, clips=2, complete=False)  # validation still writing: not yet
    update()
    update()  # told once, not at every update
    text = plain_out.getvalue()
    assert text.count("samples step 10:") == 1 and "samples step 20" not in text
    assert f"samples step 10: {step_dir}" in text
    assert f"clip 1: PSNR 18.50 dB  {step_dir / 'clip-1.png'} {step_dir / 'clip-1.mp4'}" in text
    (told,) = json_samples()
    assert told["step"] == 10 and told["dir"] == str(step_dir) and told["run"] == view.run.run_id
    assert [c["png"] for c in told["clips"]] == [str(step_dir / "clip-0.png"), str(step_dir / "clip-1.png")]
    assert told["clips"][0]["video"] == str(step_dir / "clip-0.mp4") and told["clips"][0]["psnr"] == 19.0

    write_sample_step(run, 20, clips=2)  # its index.json lands
    update()
    assert plain_out.getvalue().count("samples step 20:") == 1
    assert [o["step"] for o in json_samples()] == [10, 20]

    # status --json and status name the newest samples' paths
    info = json.loads(json.dumps(run_info(RunDir(run), pool=None, check=False), default=str))
    newest = run / "samples" / "step-20"
    assert info["samples"]["step"] == 20 and info["samples"]["dir"] == str(newest)
    assert info["samples"]["clips"][1]["png"] == str(newest / "clip-1.png")
    capsys.readouterr()
    assert main(["status", str(run), "--no-check"]) == 0
    out = capsys.readouterr().out
    assert f"newest samples: step 20 ({newest})" in out
    assert f"clip 0: PSNR 20.00 dB  {newest / 'clip-0.png'}  {newest / 'clip-0.mp4'}" in out
