"""Writes the README's screenshots: SVGs exported by the console itself, drawn from the fixed
samples of the UI tests (a 16-node run with a straggler, a stalled and a failed node).

    .venv/bin/python -m tests.ui.screenshots docs/
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

from taehv_console.ui.config import ConsoleConfig


async def _shot(path: Path, size: tuple[int, int], setup) -> None:
    from tests.ui.conftest import app_for

    app = app_for(
        ["--runs", "/shared/runs", "--hosts", "/shared/hostfile"], startup="none", config=ConsoleConfig()
    )
    async with app.run_test(size=size) as pilot:
        await setup(app, pilot)
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.pause()
        path.write_text(app.export_screenshot(title="taehv-console"))
    print(f"wrote {path}")


def main(out: str = "docs") -> int:
    os.environ["TZ"] = "UTC"
    os.environ["XDG_CONFIG_HOME"] = "/nonexistent/home/.config"
    time.tzset()
    from taehv_console.core.flow.launch import review as make_review
    from taehv_console.core.flow.preflight import PreflightResult
    from taehv_console.core.models import BackendKind
    from taehv_console.ui.messages import LogChunk, LogRead
    from taehv_console.ui.screens.dashboard import DashboardScreen
    from taehv_console.ui.screens.node import NodeScreen
    from taehv_console.ui.screens.preset import PresetScreen
    from taehv_console.ui.screens.review import ReviewScreen
    from tests.ui import samples
    from tests.ui.test_snapshots import _config

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)

    def wizard(app, step: int) -> None:
        w = app.wizard
        w.topology, w.probes = samples.topology(16), samples.probes(16)
        chosen = _config(16)
        report = samples.report(16)
        ok = type(report)(
            report.topology, report.probes, tuple(x for x in report.findings if x.severity.value != "error")
        )
        w.preflight = PreflightResult(chosen.config, chosen.chosen, ok, BackendKind.SSH, 29500)
        w.chosen = chosen
        if step >= 3:
            w.review = make_review(
                app.options, w.topology, w.probes, w.preflight, chosen, app.pool, now=samples.T0
            )

    async def dashboard(app, pilot):
        app.cluster_state = samples.cluster_state(16, trouble=True)
        await app.push_screen(DashboardScreen())

    async def node(app, pilot):
        app.cluster_state = samples.cluster_state(16, trouble=True)
        screen = NodeScreen(samples.node_name(5))
        await app.push_screen(screen)
        screen.post_message(LogRead(LogChunk(0, samples.LOG_LINES)))

    async def preset(app, pilot):
        wizard(app, 2)
        await app.push_screen(PresetScreen())

    async def review(app, pilot):
        wizard(app, 3)
        await app.push_screen(ReviewScreen())

    for name, size, setup in (
        ("dashboard", (160, 50), dashboard),
        ("node", (140, 42), node),
        ("preset", (120, 36), preset),
        ("review", (120, 36), review),
    ):
        asyncio.run(_shot(folder / f"console-{name}.svg", size, setup))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
