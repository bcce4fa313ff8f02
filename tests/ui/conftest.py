"""UI test fixtures: an environment that reads nothing of the user's (settings, themes, presets,
SSH files), a fixed time zone for run ids, and apps built by the CLI's own make_app."""

from __future__ import annotations

import os
import time

import pytest
from textual.css.query import NoMatches

from taehv_console.cli import console_options
from taehv_console.ui.app import TaehvConsole, make_app
from taehv_console.ui.config import ConsoleConfig


@pytest.fixture(autouse=True)
def console_env(tmp_path_factory, monkeypatch):
    home = tmp_path_factory.mktemp("console-home")
    ssh_config = home / "ssh_config"
    ssh_config.write_text("")
    # a fixed path that does not exist: no user settings, themes or presets, and the help screen's
    # "rebind keys in ..." line is the same on every machine
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent/home/.config")
    monkeypatch.setenv("TAEHV_SSH_CONFIG", str(ssh_config))
    monkeypatch.setenv("TAEHV_KNOWN_HOSTS", str(home / "known_hosts"))
    for name in ("TAEHV_CONSOLE_CONFIG", "TAEHV_CONSOLE_PRESETS", "NO_COLOR", "TEXTUAL_THEME"):
        monkeypatch.delenv(name, raising=False)
    old_tz = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"  # run ids are local time: fixed here so snapshots do not depend on the machine
    time.tzset()
    yield home
    if old_tz is None:
        os.environ.pop("TZ", None)
    else:
        os.environ["TZ"] = old_tz
    time.tzset()


def app_for(argv: list[str], **kwargs) -> TaehvConsole:
    """The console for a command line, built as the CLI builds it."""
    options, theme = console_options(argv)
    return make_app(options, theme=theme, **kwargs)


def sample_app(*argv: str, config: ConsoleConfig | None = None, startup: str = "none") -> TaehvConsole:
    """The console as the CLI builds it, without start-up work (tests push screens themselves)."""
    return app_for(["--runs", "/shared/runs", *argv], startup=startup, config=config or ConsoleConfig())


@pytest.fixture
def no_color(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    yield
    os.environ.pop("NO_COLOR", None)


async def wait_until(pilot, predicate, timeout: float, what: str) -> None:
    """Pause the app's pilot until `predicate()` holds (conditions, not fixed sleeps: CI is loaded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except NoMatches:  # a screen is up before its widgets mount: on a busy machine, a while before
            pass
        await pilot.pause(0.1)
    raise AssertionError(
        f"timed out after {timeout} s waiting for {what}; screen {type(pilot.app.screen).__name__}"
    )
