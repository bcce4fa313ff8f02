"""Bad input read by the TUI is an error dialog naming it, and the console goes on (Pilot, real
files): the TUI catches what taehv_console/errors.py's one table lists, shows it by its class and
message without a traceback, and writes no crash log for it (issue 44)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

from textual.widgets import Static

from taehv_console.errors import ERROR_CODES, exit_code_for_error
from taehv_console.ui.errors import USER_ERRORS, error_text, is_user_error
from tests.ui import samples
from tests.ui.conftest import sample_app, wait_until

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "cpu-smoke-done"


def _dialog_shown(app) -> bool:
    return type(app.screen).__name__ == "MessageScreen" and bool(app.screen.query("#dialog-body"))


def _dialog_text(app) -> tuple[str, str]:
    title = str(app.screen.query_one("#dialog-title", Static).render())
    body = str(app.screen.query_one("#dialog-body", Static).render())
    return title, body


async def _still_running(pilot, app) -> None:
    """The dialog closes and the console answers keys: the help screen opens and closes."""
    await pilot.press("escape")
    await wait_until(pilot, lambda: type(app.screen).__name__ != "MessageScreen", 10, "the dialog to close")
    await pilot.press("question_mark")
    await wait_until(pilot, lambda: type(app.screen).__name__ == "HelpScreen", 10, "the help screen")
    assert app.is_running and app.return_code is None


def _damaged_run(tmp_path: Path, what: str) -> Path:
    run = tmp_path / "runs" / RECORDED.name
    shutil.copytree(RECORDED, run)
    if what == "run.toml":
        (run / "run.toml").write_text("[run\nname = 'not toml'\n")
    else:  # valid JSON of the wrong shape: the campaign's "attempts": "notalist"
        state = json.loads((run / "state.json").read_text())
        state["attempts"] = "notalist"
        (run / "state.json").write_text(json.dumps(state))
    return run


def test_a_damaged_run_file_is_a_named_error_and_the_console_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TAEHV_CRASH_DIR", str(tmp_path / "crashes"))
    for what, kind in (("run.toml", "ConfigError"), ("state.json", "StateError")):
        run = _damaged_run(tmp_path / what, what)
        asyncio.run(_attach_damaged(run, what, kind))
    assert not (tmp_path / "crashes").exists()  # a user's error is no crash: no log written


async def _attach_damaged(run: Path, what: str, kind: str) -> None:
    app = sample_app("--runs", str(run.parent), "--run", str(run), startup="auto")
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: _dialog_shown(app), 30, "the error dialog")
        title, body = _dialog_text(app)
        assert title == "Could not attach", (title, body)
        assert body.startswith(f"{kind}: ") and what in body, body
        assert "Traceback" not in body and app.session is None
        await _still_running(pilot, app)


def test_a_damaged_preset_is_a_named_error_and_the_console_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TAEHV_CRASH_DIR", str(tmp_path / "crashes"))
    preset = tmp_path / "broken.toml"
    preset.write_text("[optim]\nlr = 'fast'\nmax_steps = -3\n")
    asyncio.run(_damaged_preset(preset))
    assert not (tmp_path / "crashes").exists()


async def _damaged_preset(preset: Path) -> None:
    from taehv_console.ui.screens.preflight import PreflightScreen

    app = sample_app("--preset", str(preset))
    async with app.run_test(size=(120, 40)) as pilot:
        app.wizard.topology, app.wizard.probes = samples.topology(1), samples.probes(1)
        await app.push_screen(PreflightScreen())
        await wait_until(pilot, lambda: _dialog_shown(app), 60, "the error dialog")
        title, body = _dialog_text(app)
        assert title == "preflight failed", (title, body)
        assert body.startswith("ConfigError: ") and str(preset) in body and "optim.lr" in body, body
        assert "Traceback" not in body
        await _still_running(pilot, app)


def test_the_tui_catches_every_class_of_the_one_table(tmp_path, monkeypatch):
    """The TUI's net is errors.py's table itself: each class listed there (and a subclass of one)
    is a user's error, shown as `Class: message`; a bug is one line naming its crash log."""
    monkeypatch.setenv("TAEHV_CRASH_DIR", str(tmp_path / "crashes"))
    for cls in ERROR_CODES:
        assert issubclass(cls, USER_ERRORS) and cls in USER_ERRORS
    config_error = next(c for c in ERROR_CODES if c.__name__ == "ConfigError")
    sub = type("NewKindError", (config_error,), {})("run.toml: model.family: unknown family")
    assert is_user_error(sub) and exit_code_for_error(sub) is not None
    assert error_text(sub) == "NewKindError: run.toml: model.family: unknown family"
    assert error_text(PermissionError(13, "Permission denied", "/runs")).startswith("PermissionError: ")
    try:
        {}["attempts"]  # a bug: raised, so its traceback is there to log
    except KeyError as err:
        bug = error_text(err)
    logs = list((tmp_path / "crashes").glob("crash-*.log"))
    assert len(logs) == 1 and str(logs[0]) in bug and "KeyError" in bug and "Traceback" not in bug
    assert "Traceback" in logs[0].read_text()
