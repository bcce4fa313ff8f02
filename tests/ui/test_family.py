"""The TAE family in the TUI and `status` (issue 45), with Pilot and real files: the wizard's Preset
step offers every family with the model it serves; choosing one re-checks the preset's clip against
the family's clip rule (proposing the nearest clip that fits, said under the choice) and the choice
reaches the review and the run's run.toml as model.family; the dashboard's header and `status`
(text, list and --json) name the run's family and the file its weights are exported as."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

from textual.widgets import Select, Static

from taehv_console.cli import main
from taehv_console.core.flow.config import ChosenConfig
from taehv_console.core.flow.preflight import PreflightResult
from taehv_console.core.models import BackendKind
from taehv_console.core.plan.presets import load_preset
from taehv_console.core.run.create import create_run
from taehv_console.core.run.rundir import create_run_dir
from taehv_console.core.watch.monitor import snapshot_once
from tests.ui import samples
from tests.ui.conftest import sample_app, wait_until
from trainer.config import load_config
from trainer.families import FAMILIES

RECORDED = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "cpu-smoke-done"


def _text(widget) -> str:
    r = widget.render()
    return str(getattr(r, "plain", r))


async def _choose(pilot, select: Select, name: str) -> None:
    """As a user picks it: focus the choice, open it, move to the family, enter."""
    names = [value for _label, value in select._options]  # the rows in their shown order
    select.focus()
    await pilot.press("enter")
    await pilot.pause()
    steps = names.index(name) - names.index(select.value)
    for _ in range(abs(steps)):
        await pilot.press("down" if steps > 0 else "up")
    await pilot.press("enter")
    await wait_until(pilot, lambda: select.value == name, 10, f"family {name} chosen")
    await pilot.pause()


async def _preset_step(pilot, app):
    """The wizard's Preset step after detection and preflight found one 8-GPU node (8gpu-h100)."""
    from taehv_console.ui.screens.preset import PresetScreen

    w = app.wizard
    w.topology, w.probes = samples.topology(1), samples.probes(1)
    cfg = load_preset("8gpu-h100").config
    assert (cfg.model.family, cfg.data.frames, cfg.data.width) == ("taehv", 12, 720)
    w.preflight = PreflightResult(
        config=cfg,
        chosen="preset 8gpu-h100",
        report=samples.report(1),
        backend=BackendKind.LOCAL,
        master_port=29500,
    )
    w.chosen = ChosenConfig(cfg, "preset 8gpu-h100")
    await app.push_screen(PresetScreen())
    await app.workers.wait_for_complete()
    await pilot.pause()
    return app.screen


def test_the_wizard_offers_the_family_and_the_choice_reaches_run_toml(tmp_path):
    asyncio.run(_wizard_family(tmp_path))


async def _wizard_family(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    app = sample_app("--runs", str(runs))
    async with app.run_test(size=(160, 50)) as pilot:
        w = app.wizard
        screen = await _preset_step(pilot, app)
        select = screen.query_one("#field-model-family", Select)
        info = screen.query_one("#family-info", Static)

        # every family, each with the model it serves; taehv by default
        rows = {value: label for label, value in select._options}
        assert list(rows) == list(FAMILIES) and select.value == "taehv"
        assert all(FAMILIES[name].serves in str(label) for name, label in rows.items())
        assert "taehv.safetensors" in _text(info)

        # LTX-2: 8x time and 32-pixel crops; the preset's 12 x 480 x 720 does not fit: proposed anew
        await _choose(pilot, select, "taeltx_2")
        note = _text(info)
        assert "taeltx_2.safetensors" in note, note
        assert "frames 12 → 16" in note and "width 720 → 704" in note and "height" not in note, note
        assert not screen._errors.get("model.family")
        # a clip length typed against the family is refused, naming both
        more = screen.query_one("#field-more")
        more.value = "data.frames=12"
        await pilot.pause()
        err = _text(screen.query_one("#error-more", Static))
        assert "data.frames" in err and "taeltx_2" in err and "16" in err, err
        screen.action_next_step()
        await pilot.pause()
        assert type(app.screen).__name__ == "PresetScreen"  # refused while a field is red
        more.value = ""

        # H3: 17-frame chunks
        await _choose(pilot, select, "taeh3")
        note = _text(info)
        assert "frames 12 → 17" in note and "taeh3.safetensors" in note and "width" not in note, note

        # taew2_1: the preset's clip fits as it is; Continue builds the review with it
        await _choose(pilot, select, "taew2_1")
        note = _text(info)
        assert "taew2_1.safetensors" in note and "→" not in note.replace("exported as", ""), note
        await pilot.press("n")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "ReviewScreen", 120, "the review")
        review = w.review
        assert review.config.model.family == "taew2_1" and "model.family=taew2_1" in w.overrides
        # the review fills its figures once the screen is up: on a busy machine, after it appears
        await wait_until(
            pilot, lambda: _text(app.screen.query_one("#figures", Static)), 60, "the review's figures"
        )
        figures = _text(app.screen.query_one("#figures", Static))
        assert "taew2_1" in figures and "Wan 2.1" in figures and "taew2_1.safetensors" in figures

        # the run directory the launch writes holds it (RunSession.launch's own first two steps)
        run_dir = create_run_dir(str(runs), review.config.run.preset, now=review.created_at)
        run = create_run(str(runs), review.config, review.spec, run=run_dir)
        written = load_config(run.run_toml)
        assert written.model.family == "taew2_1" and 'family = "taew2_1"' in run.run_toml.read_text()

        # back on the Preset step, the wizard's choice is kept
        await pilot.press("escape")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "PresetScreen", 10, "the preset step")
        assert app.screen.query_one("#field-model-family", Select).value == "taew2_1"


def test_set_model_family_preselects_it_and_a_chosen_family_outlives_the_preset_cursor():
    asyncio.run(_preselected())


async def _preselected() -> None:
    from textual.widgets import DataTable, Input

    app = sample_app("--set", "model.family=taeh3")
    async with app.run_test(size=(160, 50)) as pilot:
        screen = await _preset_step(pilot, app)
        select = screen.query_one("#field-model-family", Select)
        assert select.value == "taeh3"
        assert "frames 12 → 17" in _text(screen.query_one("#family-info", Static))
        assert "model.family" not in screen.query_one("#field-more", Input).value  # the choice holds it
        # another preset highlighted: the family chosen stays, checked against that preset's clip
        await _choose(pilot, select, "taeltx_2")
        table = screen.query_one("#choices", DataTable)
        table.focus()
        await pilot.press("down")
        await pilot.pause()
        assert screen._selected.name != "auto" and select.value == "taeltx_2"
        assert "taeltx_2.safetensors" in _text(screen.query_one("#family-info", Static))

    app = sample_app("--set", "model.family=taehv9")  # no such family: said where it was typed
    async with app.run_test(size=(160, 50)) as pilot:
        screen = await _preset_step(pilot, app)
        assert screen.query_one("#field-model-family", Select).value == "taehv"
        assert "model.family=taehv9" in screen.query_one("#field-more", Input).value
        err = _text(screen.query_one("#error-more", Static))
        assert "unknown family 'taehv9'" in err and "taeltx_2" in err, err


def _run_of_family(tmp_path: Path, family: str) -> Path:
    """The recorded cpu-smoke run, its run.toml naming `family` (taew2_1 has taehv's shapes)."""
    run = tmp_path / "runs" / RECORDED.name
    shutil.copytree(RECORDED, run)
    text = (run / "run.toml").read_text()
    (run / "run.toml").write_text(text.replace("[model]\n", f'[model]\nfamily = "{family}"\n', 1))
    assert load_config(run / "run.toml").model.family == family
    return run


def test_the_dashboard_and_status_name_the_family_and_its_export(tmp_path, capsys):
    run = _run_of_family(tmp_path, "taew2_1")
    asyncio.run(_dashboard_family(run))

    assert main(["status", str(run), "--no-check"]) == 0
    out = capsys.readouterr().out
    assert "family taew2_1 (Wan 2.1, Wan 2.2 14B, Qwen-Image), exported as taew2_1.safetensors + .pth" in out
    assert main(["status", str(run), "--no-check", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["family"] == "taew2_1" and info["serves"].startswith("Wan 2.1")
    assert info["exports"] == [
        "taew2_1.safetensors",
        "taew2_1.pth",
        "taew2_1_ema.safetensors",
        "taew2_1_ema.pth",
    ]
    assert main(["status", "--runs", str(run.parent), "--no-check"]) == 0
    listing = capsys.readouterr().out
    assert "family" in listing.splitlines()[0] and "taew2_1" in listing
    assert main(["status", "--runs", str(run.parent), "--no-check", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["family"] == "taew2_1"


async def _dashboard_family(run: Path) -> None:
    from taehv_console.ui.screens.dashboard import DashboardScreen
    from taehv_console.ui.widgets.run_header import RunHeaderBar

    app = sample_app()
    async with app.run_test(size=(160, 50)) as pilot:
        app.cluster_state = snapshot_once(run)
        await app.push_screen(DashboardScreen())
        header = app.screen.query_one(RunHeaderBar)
        await wait_until(pilot, lambda: "taew2_1" in _text(header), 20, "the family in the header")
        assert "family taew2_1 → taew2_1.safetensors" in _text(header), _text(header)
        assert "done" in _text(header)  # the rest of the header as before
