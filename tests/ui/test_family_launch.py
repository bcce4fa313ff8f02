"""The family end to end in the TUI, with one real launch (Pilot; the cpu-smoke preset on this
machine): `--set model.family=taew2_1` is preselected on the wizard's Preset step, the run the
wizard launches has it in its run.toml, and the dashboard of that live run names the family and the
file its weights will be exported as. The run is stopped as soon as that is seen: the rest of a
run's life is test_console_flow's."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from taehv_console.ui import messages
from taehv_console.ui.widgets.run_header import RunHeaderBar
from tests.e2e.consoles import SMALL_RUN
from tests.ui.test_console_flow import _stop_leftovers, launch_from_the_wizard, wait_for
from trainer.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_the_launched_run_trains_the_family_chosen(tmp_path, monkeypatch):
    monkeypatch.setenv("TAEHV_SUPERVISOR", "on")
    asyncio.run(_launch_a_family(tmp_path))


async def _launch_a_family(tmp_path: Path) -> None:
    from textual.widgets import Select

    from tests.ui.conftest import sample_app

    seen: list[object] = []

    def hook(message) -> None:
        if isinstance(message, (messages.RunAttached, messages.RunEnded, messages.ControlFailed)):
            seen.append(message)
        # the Preset step as the wizard shows it: the family the command line named is chosen
        screen = app.screen_stack[-1] if app.screen_stack else None
        if type(screen).__name__ == "PresetScreen" and screen.query("#field-model-family"):
            preset_family.append(screen.query_one("#field-model-family", Select).value)

    preset_family: list[object] = []
    app = sample_app(
        "--runs",
        str(tmp_path / "runs"),
        *SMALL_RUN,
        "--set",
        "model.family=taew2_1",
        "--set",
        "optim.max_steps=1000",
        "--set",
        "schedule.val_every=1000",
        "--set",
        "schedule.checkpoint_every=1000",
        startup="auto",
    )
    run_path = None
    try:
        async with app.run_test(size=(160, 40), message_hook=hook) as pilot:
            run_path, review = await launch_from_the_wizard(pilot, app, seen)
            assert preset_family and preset_family[-1] == "taew2_1"
            assert review.config.model.family == "taew2_1"
            written = Path(run_path) / "run.toml"
            assert load_config(written).model.family == "taew2_1"
            assert 'family = "taew2_1"' in written.read_text()

            header = app.screen.query_one(RunHeaderBar)

            def header_text() -> str:
                r = header.render()
                return str(getattr(r, "plain", r))

            await wait_for(pilot, lambda: "taew2_1" in header_text(), 60, "the family in the header")
            assert "family taew2_1 → taew2_1.safetensors" in header_text(), header_text()
        assert not any(isinstance(m, messages.ControlFailed) for m in seen), seen
    finally:
        _stop_leftovers(run_path)
