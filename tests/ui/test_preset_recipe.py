"""The recipe on the wizard's Preset step (Pilot): a teacher VAE directory typed into the form becomes
`loss.teacher`, the planner's online-vs-cached cost shows under it, and a bad value is flagged."""

from __future__ import annotations

import asyncio

from textual.widgets import Input, Static

from taehv_console.core.flow.config import ChosenConfig, check_overrides
from taehv_console.core.flow.preflight import PreflightResult
from taehv_console.core.models import BackendKind
from taehv_console.core.plan.presets import load_preset
from tests.ui import samples
from tests.ui.conftest import sample_app


def test_teacher_dir_in_the_form_becomes_the_distillation_recipe(monkeypatch):
    asyncio.run(_recipe_form(monkeypatch))


async def _recipe_form(monkeypatch):
    from taehv_console.ui.screens.preset import PresetScreen

    app = sample_app()
    built: list[tuple[str, list[str]]] = []
    # the next step's preflight and review are other tests' business: keep what the form hands over
    monkeypatch.setattr(
        PresetScreen, "_build", lambda self, preset, overrides: built.append((preset, overrides))
    )
    async with app.run_test(size=(160, 50)) as pilot:
        w = app.wizard
        w.topology, w.probes = samples.topology(1), samples.probes(1)
        cfg = load_preset("8gpu-h100").config
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
        screen = app.screen
        hint = screen.query_one("#recipe-hint", Static)
        assert "reconstruction only" in str(hint.render())

        screen.query_one("#field-loss-teacher", Input).value = "/models/hunyuan video/vae"
        await pilot.pause()
        assert "teacher online" in str(hint.render()) and "GPU-h" in str(hint.render())
        screen.query_one("#field-adversarial-weight", Input).value = "-1"
        await pilot.pause()
        assert "-invalid" in screen.query_one("#field-adversarial-weight", Input).classes
        screen.action_next_step()
        assert built == []  # refused while a field is red
        screen.query_one("#field-adversarial-weight", Input).value = "0.1"
        screen.query_one("#field-loss-teacher_cache", Input).value = "/cache/latents"
        await pilot.pause()
        assert "teacher cached" in str(hint.render())
        screen.action_next_step()
        base = screen._selected.config
    [(_preset, overrides)] = built
    chosen, err = check_overrides(base, overrides)
    assert not err
    assert (
        chosen.loss.teacher == "/models/hunyuan video/vae" and chosen.loss.teacher_cache == "/cache/latents"
    )
    assert chosen.adversarial.weight == 0.1 and chosen.loss.decoder_on_teacher_latents
