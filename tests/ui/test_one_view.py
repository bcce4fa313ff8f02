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
from taehv_console.headless import JsonView, PlainView
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
