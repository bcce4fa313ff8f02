"""The Samples view on real sample directories (PNG strips and videos written as validation writes
them): reached from the dashboard (v) and the palette; keys switch clip and step and compare with
the previous validation; a new step shows while the view is open; no samples yet is said in words.
Snapshots draw it with half-blocks (the settings file's `images = "half-blocks"`), the renderer a
terminal without Kitty graphics or Sixel gets, tmux included."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from taehv_console.ui.config import ConsoleConfig
from tests.sample_steps import write_sample_step
from tests.ui import samples
from tests.ui.conftest import sample_app, wait_until

HALF_BLOCKS = ConsoleConfig(images="half-blocks")
# snapshots show the run's paths: a fixed run directory keeps them the same on every machine
SNAP_RUN = Path("/tmp/taehv-console-snapshots/20251231-121500-8gpu-h100")


def _state_for(run_dir: Path):
    state = samples.cluster_state(1)
    return dataclasses.replace(state, run=dataclasses.replace(state.run, run_dir=str(run_dir)))


def _strip(app, which: str = "current"):
    return app.screen.query_one(f"#{which}-strip").image


def _text(app, widget_id: str) -> str:
    return str(app.screen.query_one(f"#{widget_id}").render())


async def _open_samples(pilot, run_dir: Path) -> None:
    from taehv_console.ui.screens.dashboard import DashboardScreen

    app = pilot.app
    app.cluster_state = _state_for(run_dir)
    await app.push_screen(DashboardScreen())
    await pilot.pause()
    await pilot.press("v")
    await wait_until(pilot, lambda: type(app.screen).__name__ == "SamplesScreen", 10, "the Samples view")


def _same_pixels(image, path: Path) -> bool:
    if image is None:
        return False
    with Image.open(path) as im:
        return np.array_equal(np.asarray(image.convert("RGB")), np.asarray(im.convert("RGB")))


def test_keys_switch_clip_and_step_compare_and_a_new_step_shows(tmp_path):
    run_dir = tmp_path / "run"
    for step in (10, 20):
        write_sample_step(run_dir, step, clips=3)
    app = sample_app(config=HALF_BLOCKS)

    async def go():
        async with app.run_test(size=(100, 40)) as pilot:
            await _open_samples(pilot, run_dir)
            screen = app.screen
            assert screen.image_widget.__name__ == "HalfcellImage"
            await wait_until(pilot, lambda: _strip(app) is not None, 10, "the newest strip")
            s20 = run_dir / "samples" / "step-20"
            assert _same_pixels(_strip(app), s20 / "clip-0.png")
            assert "step 20" in _text(app, "samples-title") and "newest of 2" in _text(app, "samples-title")
            assert "clip 0  PSNR 20.00 dB" in _text(app, "current-label")
            assert str(s20 / "clip-0.mp4") in _text(app, "samples-legend")

            # → next clip, ← back (wrapping round)
            await pilot.press("right")
            await wait_until(pilot, lambda: _same_pixels(_strip(app), s20 / "clip-1.png"), 10, "clip 1")
            assert "clip 1  PSNR 19.50 dB" in _text(app, "current-label")
            await pilot.press("left", "left")
            await wait_until(pilot, lambda: _same_pixels(_strip(app), s20 / "clip-2.png"), 10, "clip 2")

            # ↓ an earlier validation, the same clip
            await pilot.press("down")
            s10 = run_dir / "samples" / "step-10"
            await wait_until(pilot, lambda: _same_pixels(_strip(app), s10 / "clip-2.png"), 10, "step 10")
            assert "step 10" in _text(app, "samples-title") and "1 older than the newest" in _text(
                app, "samples-title"
            )
            await pilot.press("up")
            await wait_until(pilot, lambda: _same_pixels(_strip(app), s20 / "clip-2.png"), 10, "step 20")

            # c: the previous validation's strip of the same clip below, both PSNRs and the gain
            assert not screen.query_one("#previous-box").display
            await pilot.press("c")
            await wait_until(
                pilot,
                lambda: (
                    _strip(app, "previous") is not None
                    and _same_pixels(_strip(app, "previous"), s10 / "clip-2.png")
                ),
                10,
                "the previous validation's strip",
            )
            assert screen.query_one("#previous-box").display
            assert "step 10 (previous validation)  clip 2  PSNR 18.00 dB" in _text(app, "previous-label")
            assert "clip 2  PSNR 19.00 dB (+1.00 dB)" in _text(app, "current-label")

            # at the oldest validation there is nothing earlier: said in words, no second strip
            await pilot.press("down")
            await wait_until(
                pilot, lambda: "no earlier validation" in _text(app, "previous-label"), 10, "oldest"
            )
            assert not screen.query_one("#previous-box").display
            await pilot.press("up")
            await wait_until(
                pilot, lambda: "step 10 (previous" in _text(app, "previous-label"), 10, "step 20"
            )

            # a validation writes step 30 while the view is open: the newest is followed
            write_sample_step(run_dir, 30, clips=3)
            await wait_until(pilot, lambda: "step 30" in _text(app, "samples-title"), 15, "step 30 to show")
            s30 = run_dir / "samples" / "step-30"
            await wait_until(
                pilot, lambda: _same_pixels(_strip(app), s30 / "clip-2.png"), 10, "step 30's strip"
            )
            assert "step 20 (previous validation)" in _text(app, "previous-label")

            # on an older step, a new one does not move the view away from it
            await pilot.press("down")
            await wait_until(pilot, lambda: "step 20" in _text(app, "samples-title"), 10, "step 20 chosen")
            write_sample_step(run_dir, 40, clips=3, complete=False)  # still being written: not shown
            write_sample_step(run_dir, 50, clips=3)
            await wait_until(pilot, lambda: "of 4 validations" in _text(app, "samples-title"), 15, "step 50")
            assert "step 20" in _text(app, "samples-title")

            await pilot.press("escape")
            await wait_until(
                pilot, lambda: type(app.screen).__name__ == "DashboardScreen", 10, "the dashboard"
            )

    asyncio.run(go())


def test_no_samples_yet_says_why_and_the_first_one_shows_when_written(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.toml").write_text("[schedule]\nval_every = 10\n")
    app = sample_app(config=HALF_BLOCKS)

    async def go():
        async with app.run_test(size=(100, 30)) as pilot:
            await _open_samples(pilot, run_dir)
            await wait_until(
                pilot, lambda: "No samples yet" in _text(app, "samples-title"), 10, "the empty state"
            )
            text = _text(app, "samples-title")
            assert "every 10 steps (schedule.val_every)" in text
            assert str(run_dir / "samples" / "step-<N>") in text
            assert not app.screen.query_one("#samples-body").display
            write_sample_step(run_dir, 10, clips=1)
            await wait_until(pilot, lambda: _strip(app) is not None, 15, "the first strip")
            assert "step 10" in _text(app, "samples-title")

    asyncio.run(go())


def test_a_step_written_again_shows_its_new_strip(tmp_path):
    """A resumed run redoing a validation removes the step's index.json, then writes it all again."""
    run_dir = tmp_path / "run"
    step_dir = write_sample_step(run_dir, 10, clips=1, frames=4, videos=False)
    app = sample_app(config=HALF_BLOCKS)

    async def go():
        async with app.run_test(size=(100, 30)) as pilot:
            await _open_samples(pilot, run_dir)
            await wait_until(
                pilot, lambda: _same_pixels(_strip(app), step_dir / "clip-0.png"), 10, "the strip"
            )
            (step_dir / "index.json").unlink()
            await wait_until(pilot, lambda: "No samples yet" in _text(app, "samples-title"), 10, "no samples")
            write_sample_step(run_dir, 10, clips=1, frames=6, videos=False)  # 6 frames: another picture
            await wait_until(
                pilot, lambda: _strip(app) is not None and _strip(app).width == 6 * 32, 10, "the new"
            )
            assert _same_pixels(_strip(app), step_dir / "clip-0.png")

    asyncio.run(go())


def test_the_palette_opens_the_samples_view_and_an_unreadable_strip_is_named(tmp_path):
    from taehv_console.ui.commands import ConsoleCommands
    from taehv_console.ui.screens.dashboard import DashboardScreen

    run_dir = tmp_path / "run"
    write_sample_step(run_dir, 10, clips=1, videos=False)
    (run_dir / "samples" / "step-10" / "clip-0.png").write_bytes(b"not a png")
    app = sample_app(config=HALF_BLOCKS)

    async def go():
        async with app.run_test(size=(100, 30)) as pilot:
            app.cluster_state = _state_for(run_dir)
            await app.push_screen(DashboardScreen())
            await pilot.pause()
            names = [name for name, _cb, _help in ConsoleCommands(app.screen)._commands()]
            assert "Show samples (reconstructions)" in names
            await pilot.press("ctrl+p")
            await pilot.pause()
            for ch in "show samples":
                await pilot.press(ch if ch != " " else "space")
            await pilot.pause(0.5)
            await pilot.press("enter")
            await wait_until(
                pilot, lambda: type(app.screen).__name__ == "SamplesScreen", 10, "the Samples view"
            )
            await wait_until(
                pilot, lambda: "cannot read" in _text(app, "current-label"), 10, "the read error"
            )
            assert str(run_dir / "samples" / "step-10" / "clip-0.png") in _text(app, "current-label")
            assert _strip(app) is None

    asyncio.run(go())


# ------------------------------------------------------------------------------------ snapshots


@pytest.fixture
def snap_run():
    shutil.rmtree(SNAP_RUN.parent, ignore_errors=True)
    (SNAP_RUN / "run.toml").parent.mkdir(parents=True)
    (SNAP_RUN / "run.toml").write_text("[schedule]\nval_every = 10\n")
    yield SNAP_RUN
    shutil.rmtree(SNAP_RUN.parent, ignore_errors=True)


def _drawn(app) -> bool:
    return _strip(app) is not None


def _snap(snap_compare, run_dir: Path, size, keys=(), first=_drawn, until=_drawn):
    """The Samples view of `run_dir` once `first(app)` holds, after `keys`, once `until(app)` holds."""
    from taehv_console.ui.screens.samples import SamplesScreen

    app = sample_app(config=HALF_BLOCKS)

    async def run_before(pilot):
        app.cluster_state = _state_for(run_dir)
        await app.push_screen(SamplesScreen(str(run_dir), images="half-blocks"))
        await wait_until(pilot, lambda: first(app), 10, "the view to draw")
        for key in keys:
            await pilot.press(key)
        await wait_until(pilot, lambda: until(app), 10, "the view to draw after the keys")
        await pilot.pause()

    return snap_compare(app, run_before=run_before, terminal_size=size)


@pytest.mark.parametrize("size", [pytest.param((80, 24), id="80x24"), pytest.param((160, 50), id="160x50")])
def test_samples_snapshot(snap_compare, snap_run, size):
    for step in (10, 20):
        write_sample_step(snap_run, step, clips=4, frames=6, videos=False)
    clip_1 = snap_run / "samples" / "step-20" / "clip-1.png"
    assert _snap(
        snap_compare, snap_run, size, keys=("right",), until=lambda app: _same_pixels(_strip(app), clip_1)
    )


def test_samples_compare_snapshot(snap_compare, snap_run):
    for step in (10, 20):
        write_sample_step(snap_run, step, clips=4, frames=6, videos=False)
    assert _snap(
        snap_compare,
        snap_run,
        (160, 50),
        keys=("c",),
        until=lambda app: _same_pixels(
            _strip(app, "previous"), snap_run / "samples" / "step-10" / "clip-0.png"
        ),
    )


def test_samples_empty_snapshot(snap_compare, snap_run):
    empty = lambda app: "No samples" in _text(app, "samples-title")
    assert _snap(snap_compare, snap_run, (80, 24), first=empty, until=empty)


def test_dashboard_before_the_first_step_snapshot(snap_compare):
    """The loss, PSNR and clips/s panes say "no data yet" and draw no line (once two rows of solid
    accent blocks)."""
    from taehv_console.core.watch.state import Histories
    from taehv_console.ui.screens.dashboard import DashboardScreen

    state = samples.cluster_state(1)
    state = dataclasses.replace(
        state,
        history=Histories(),
        run=dataclasses.replace(
            state.run, step=None, loss=None, psnr=None, clips_per_s=None, phase="starting"
        ),
    )
    app = sample_app()

    async def run_before(pilot):
        app.cluster_state = state
        await app.push_screen(DashboardScreen())
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        from textual.widgets import Sparkline

        assert not any(s.display for s in app.screen.query(Sparkline))

    assert snap_compare(app, run_before=run_before, terminal_size=(120, 30))
