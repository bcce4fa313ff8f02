"""Themes as data, the settings file, rebinding keys by binding id, --theme, NO_COLOR, the command
palette, and the pure helpers the widgets draw with."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from taehv_console.core.flow import config as flow_config
from taehv_console.core.flow import form
from taehv_console.core.flow.runs import RunEntry
from taehv_console.ui import formatting as f
from taehv_console.ui.app import binding_ids
from taehv_console.ui.config import ConsoleConfig, ConsoleConfigError, load_console_config
from taehv_console.ui.messages import ClusterUpdated, RunProgressed
from taehv_console.ui.themes import HEALTH_STATES, ThemeFileError, load_themes, parse_theme, shipped_theme_dir
from tests.ui import samples
from tests.ui.conftest import app_for, sample_app


def run(coro):
    return asyncio.run(coro)


# ------------------------------------------------------------------------------------ themes


def test_shipped_themes_are_dark_light_high_contrast_each_with_every_health_colour():
    themes = load_themes((shipped_theme_dir(),))
    assert themes.names[:3] == ("dark", "light", "high-contrast")
    for t in themes.themes:
        assert {f"health-{s}" for s in HEALTH_STATES} <= set(t.variables), t.name
    assert [t.dark for t in themes.themes[:3]] == [True, False, True]


@pytest.mark.parametrize(
    "text, message",
    [
        (
            'name = "x"\n[colors]\nprimary = "not-a-colour"\n',
            "[colors] primary = 'not-a-colour' is not a colour",
        ),
        (
            'name = "x"\n[colors]\nprimary = "#fff"\n[health]\nok = "#00ff00"\nmeh = "#fff"\n',
            "[health] meh: unknown",
        ),
        ('name = "x"\ncolours = 1\n', "unknown key(s) colours"),
        ('name = "x"\n[colors]\nsecondary = "#fff"\n', "[colors] primary is required"),
    ],
)
def test_a_broken_theme_file_names_the_file_and_the_field(text, message):
    with pytest.raises(ThemeFileError) as err:
        parse_theme(text, "/home/u/.config/taehv-console/themes/x.toml")
    assert "x.toml" in str(err.value) and message in str(err.value)


def test_user_themes_load_beside_the_shipped_ones_and_a_broken_one_is_reported_not_fatal(tmp_path):
    (tmp_path / "solar.toml").write_text('name = "solar"\ndark = false\n[colors]\nprimary = "#268bd2"\n')
    (tmp_path / "bad.toml").write_text('[colors]\nprimary = "nope"\n')
    themes = load_themes((shipped_theme_dir(), tmp_path))
    assert "solar" in themes.names and "dark" in themes.names
    assert len(themes.errors) == 1 and "bad.toml" in themes.errors[0]
    solar = next(t for t in themes.themes if t.name == "solar")
    assert solar.variables["health-failed"]  # defaults fill what a user theme leaves out


def test_theme_from_the_command_line_wins_over_the_settings_file(console_env):
    app = app_for(["--theme", "light"], startup="none", config=ConsoleConfig(theme="high-contrast"))
    assert app.initial_theme == "light"
    app = app_for([], startup="none", config=ConsoleConfig(theme="high-contrast"))
    assert app.initial_theme == "high-contrast"
    with pytest.raises(ConsoleConfigError, match="unknown theme 'neon'.*dark, light, high-contrast"):
        app_for(["--theme", "neon"], startup="none", config=ConsoleConfig())


def test_t_cycles_through_the_themes():
    app = sample_app()

    async def go():
        async with app.run_test() as pilot:
            assert app.theme == "dark"
            seen = []
            for _ in range(3):
                await pilot.press("t")
                seen.append(app.theme)
            assert seen == ["light", "high-contrast", "dark"]

    run(go())


def test_no_color_is_respected_and_states_stay_readable_without_colour(no_color):
    app = sample_app()
    assert app.no_color  # Textual drops colour (its Monochrome filter)
    state = samples.cluster_state(16, trouble=True)
    from taehv_console.ui.widgets.node_grid import node_line

    texts = {n.name: node_line(n, [r for r in state.ranks if r.node == n.name]).plain for n in state.nodes}
    assert "‖ stalled" in texts["gpu-node-06"] and "✗ failed" in texts["gpu-node-12"]
    assert "◐ degraded" in texts["gpu-node-04"] and "● ok" in texts["gpu-node-01"]


# ---------------------------------------------------------------------------- settings file


def test_settings_file_is_optional_and_read_when_present(tmp_path, monkeypatch):
    path = tmp_path / "console.toml"
    assert load_console_config(path) == ConsoleConfig()
    path.write_text(
        'theme = "light"\nimages = "half-blocks"\n[keys]\nstop = "ctrl+x"\nhelp = "f1, question_mark"\n'
    )
    monkeypatch.setenv("TAEHV_CONSOLE_CONFIG", str(path))
    cfg = load_console_config(binding_ids=binding_ids())
    assert cfg.path == path and cfg.theme == "light" and cfg.images == "half-blocks"
    assert cfg.keys == {"stop": "ctrl+x", "help": "f1,question_mark"}


@pytest.mark.parametrize(
    "text, message",
    [
        ('[keys]\nstpo = "x"\n', "[keys] stpo: no binding has this id; ids: "),
        ('[keys]\nstop = ""\n', 'give the key as a string, e.g. stop = "ctrl+x"'),
        ('colour = "red"\n', "unknown setting(s) colour"),
        ('keys = "x"\n', "keys must be a table"),
        ("theme = \n", "cannot read it"),
        ('images = "ascii"\n', "images must be one of auto, kitty, sixel, half-blocks, not 'ascii'"),
    ],
)
def test_a_broken_settings_file_says_where_and_what_to_write(tmp_path, text, message):
    path = tmp_path / "console.toml"
    path.write_text(text)
    with pytest.raises(ConsoleConfigError) as err:
        load_console_config(path, binding_ids=binding_ids())
    assert str(path) in str(err.value) and message in str(err.value)


def test_every_binding_has_an_id_and_the_issue_keys_are_there():
    from taehv_console.ui.app import all_bindings

    ids = binding_ids()
    for where, b in all_bindings():
        assert b.id, (where, b)
    keys = {b.id: b.key for _, b in all_bindings()}
    assert {
        keys[i] for i in ("start", "stop", "resume", "attach", "filter-nodes", "next-theme", "help", "quit")
    } == {"s", "x", "r", "a", "slash", "t", "question_mark", "q"}
    assert keys["drill-down"] == "enter" and keys["back"] == "escape"
    assert {"drill-down", "back", "next-step", "rerun-preflight", "trust-host", "search-log"} <= ids


def test_a_binding_rebound_in_the_settings_file_answers_to_its_new_key():
    app = sample_app(config=ConsoleConfig(keys={"help": "f1", "next-theme": "ctrl+t"}))

    async def go():
        async with app.run_test() as pilot:
            await pilot.press("question_mark")
            assert type(app.screen).__name__ == "StartScreen"  # ? no longer opens help
            await pilot.press("f1")
            assert type(app.screen).__name__ == "HelpScreen"
            table = app.screen.query_one("#keys")
            rows = {str(r[1]): str(r[0]) for r in (table.get_row_at(i) for i in range(table.row_count))}
            assert rows["help"] == "f1" and rows["next-theme"] == "^t" and rows["stop"] == "x"
            await pilot.press("escape")
            await pilot.press("t")
            assert app.theme == "dark"
            await pilot.press("ctrl+t")
            assert app.theme == "light"

    run(go())


# --------------------------------------------------------------------------- palette, messages


def test_the_command_palette_offers_theme_nodes_and_runs():
    from taehv_console.ui.commands import ConsoleCommands
    from taehv_console.ui.screens.dashboard import DashboardScreen

    app = sample_app()

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            app.cluster_state = samples.cluster_state(16, trouble=True)
            app.run_entries = (
                RunEntry("20251231-121500-derived", "/shared/runs/20251231-121500-derived", "running", True),
            )
            await app.push_screen(DashboardScreen())
            await pilot.pause()
            names = [name for name, _cb, _help in ConsoleCommands(app.screen)._commands()]
            assert "Switch theme: high-contrast" in names
            assert "Open node 5: gpu-node-06" in names
            assert "Attach to run 20251231-121500-derived" in names
            # through the palette itself: ctrl+p, type, enter
            await pilot.press("ctrl+p")
            await pilot.pause()
            for ch in "switch theme: light":
                await pilot.press(ch if ch != " " else "space")
            await pilot.pause(0.5)
            await pilot.press("enter")
            await pilot.pause()
            assert app.theme == "light"
            # open node from the palette
            app.open_node("gpu-node-12")
            await pilot.pause()
            assert type(app.screen).__name__ == "NodeScreen" and app.screen.node_name == "gpu-node-12"

    run(go())


def test_a_newer_cluster_state_replaces_a_pending_one_but_progress_notes_never_do():
    a, b = ClusterUpdated(samples.cluster_state(1)), ClusterUpdated(samples.cluster_state(1))
    assert b.can_replace(a)
    assert not RunProgressed(object()).can_replace(RunProgressed(object()))


def test_the_dashboard_goes_compact_when_full_cells_would_not_fit():
    from taehv_console.ui.screens.dashboard import DashboardScreen
    from taehv_console.ui.widgets.node_grid import NodeGrid

    app = sample_app()

    async def go():
        async with app.run_test(size=(160, 50)) as pilot:
            app.cluster_state = samples.cluster_state(16, trouble=True)
            await app.push_screen(DashboardScreen())
            await pilot.pause()
            grid = app.screen.query_one(NodeGrid)
            assert not grid.has_class("-compact")
            app.cluster_state = samples.cluster_state(64, trouble=True)
            await pilot.pause()
            await pilot.pause()
            assert grid.has_class("-compact") and len(grid.visible_cells()) == 64
            # / filters: the failed node alone
            await pilot.press("slash")
            for ch in "failed":
                await pilot.press(ch)
            await pilot.pause()
            assert [c.node_name for c in grid.visible_cells()] == ["gpu-node-12"]
            assert not grid.has_class("-compact")
            await pilot.press("enter")
            await pilot.press("enter")
            await pilot.pause()
            assert type(app.screen).__name__ == "NodeScreen" and app.screen.node_name == "gpu-node-12"

    run(go())


# ----------------------------------------------------------------------------------- helpers


@pytest.mark.parametrize(
    "seconds, text",
    [(None, "-"), (3.4, "3s"), (245, "4m05s"), (7620, "2h07m"), (3 * 86400 + 4 * 3600, "3d04h")],
)
def test_durations_are_short(seconds, text):
    assert f.duration(seconds) == text


def test_bars_and_rank_spans():
    assert f.column_bar([0, 50, 100, None]) == " ▄█·"
    assert f.hbar(5, 10, 4) == "██  "
    assert (
        f.rank_span(range(8, 16)) == "r8-15"
        and f.rank_span([3]) == "r3"
        and f.rank_span([0, 2, 5]) == "r0,2,5"
    )


def test_table_cells_never_read_text_as_markup():
    cell = f.table_cell("[rank41]:[E] Watchdog caught collective operation timeout")
    assert cell.plain == "[rank41]:[E] Watchdog caught collective operation timeout"


def test_form_overrides_are_the_fields_that_changed_plus_the_free_line():
    from taehv_console.core.plan.presets import load_preset

    cfg = load_preset("cpu-smoke").config
    fields = {k: form.field_text(cfg, k) for k, _ in form.FORM_FIELDS}
    assert form.form_overrides(cfg, fields, "") == []
    fields["optim.max_steps"] = "12"
    fields["data.source"] = "/data/my videos"
    got = form.form_overrides(cfg, fields, "schedule.val_every=5")
    assert got == ["optim.max_steps=12", 'data.source="/data/my videos"', "schedule.val_every=5"]
    new, err = flow_config.check_overrides(cfg, got)
    assert not err and new.optim.max_steps == 12 and new.data.source == "/data/my videos"
    _, err = flow_config.check_overrides(cfg, ["optim.batch_per_gpu=0"])
    assert "optim.batch_per_gpu" in err


def test_the_tui_refuses_to_start_without_a_terminal(tmp_path):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [sys.executable, "-m", "taehv_console.cli", "--runs", str(tmp_path)],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=root,
        timeout=60,
        check=False,
    )
    assert r.returncode == 2 and "--no-tui" in r.stderr
