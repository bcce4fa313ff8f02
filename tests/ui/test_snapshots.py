"""SVG snapshots of every screen at 80x24 and 160x50, drawn from fixed samples (tests/ui/samples.py):
one node of 8 GPUs, and 16 nodes with a straggler, a stalled node holding the collective and a
failed node. Textual is pinned exactly: snapshots change between its releases.

After an intended change, look at the diff report, then: pytest tests/ui --snapshot-update
"""

from __future__ import annotations

import asyncio

import pytest

from taehv_console.core.flow.config import ChosenConfig
from taehv_console.core.flow.launch import review as make_review
from taehv_console.core.flow.preflight import PreflightResult
from taehv_console.core.flow.runs import RunEntry
from taehv_console.core.models import BackendKind
from taehv_console.core.plan.derive import auto_select
from taehv_console.core.plan.presets import load_preset
from taehv_console.ui.messages import LogChunk, LogRead
from tests.ui import samples
from tests.ui.conftest import sample_app

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((160, 50), id="160x50")]
CLUSTERS = [pytest.param(1, id="1node"), pytest.param(16, id="16nodes")]


def _argv(n: int) -> list[str]:
    return ["--hosts", "/shared/hostfile"] if n > 1 else []


def _config(n: int) -> ChosenConfig:
    if n == 1:
        return ChosenConfig(load_preset("8gpu-h100").config, "preset 8gpu-h100 (shipped)")
    resolved = auto_select(n, samples.GPUS, gpu_name=samples.H100, gpu_memory_gb=85.9)
    return ChosenConfig(resolved.config, f"auto: {resolved.summary}")


def _wizard(app, n: int, step: int) -> None:
    """The wizard state after `step` steps on the sample cluster (0 detect ... 3 review)."""
    w = app.wizard
    w.topology, w.probes = samples.topology(n), samples.probes(n)
    if step >= 1:
        chosen = _config(n)
        w.preflight = PreflightResult(
            config=chosen.config,
            chosen=chosen.chosen,
            report=samples.report(n),
            backend=BackendKind.LOCAL if n == 1 else BackendKind.SSH,
            master_port=29500,
        )
        w.chosen = chosen
    if step >= 3:
        w.review = make_review(
            app.options, w.topology, w.probes, w.preflight, w.chosen, app.pool, now=samples.T0
        )


async def _settle(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", CLUSTERS)
def test_detect(snap_compare, n, size):
    from taehv_console.ui.screens.detect import DetectScreen

    app = sample_app(*_argv(n))

    async def run_before(pilot):
        _wizard(app, n, 0)
        await app.push_screen(DetectScreen())
        await _settle(pilot)

    assert snap_compare(app, run_before=run_before, terminal_size=size)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", CLUSTERS)
def test_preflight(snap_compare, n, size):
    from taehv_console.ui.screens.preflight import PreflightScreen

    app = sample_app(*_argv(n))

    async def run_before(pilot):
        _wizard(app, n, 1)
        await app.push_screen(PreflightScreen())
        await _settle(pilot)

    assert snap_compare(app, run_before=run_before, terminal_size=size)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", CLUSTERS)
def test_preset(snap_compare, n, size):
    from taehv_console.ui.screens.preset import PresetScreen

    # an override typed on the command line shows in the form; a bad one is flagged under its field
    app = sample_app(*_argv(n), "--set", "optim.max_steps=50000", "--set", "schedule.val_every=0")

    async def run_before(pilot):
        _wizard(app, n, 1)
        await app.push_screen(PresetScreen())
        await _settle(pilot)

    assert snap_compare(app, run_before=run_before, terminal_size=size)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", CLUSTERS)
def test_review(snap_compare, n, size):
    from taehv_console.ui.screens.review import ReviewScreen

    app = sample_app(*_argv(n))

    async def run_before(pilot):
        _wizard(app, n, 3)
        await app.push_screen(ReviewScreen())
        await _settle(pilot)

    assert snap_compare(app, run_before=run_before, terminal_size=size)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", CLUSTERS)
def test_dashboard(snap_compare, n, size):
    from taehv_console.ui.screens.dashboard import DashboardScreen

    app = sample_app()

    async def run_before(pilot):
        app.cluster_state = samples.cluster_state(n, trouble=n > 1)
        await app.push_screen(DashboardScreen())
        await _settle(pilot)

    assert snap_compare(app, run_before=run_before, terminal_size=size)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("n", CLUSTERS)
def test_node(snap_compare, n, size):
    from taehv_console.ui.screens.node import NodeScreen

    app = sample_app()
    # the 16-node sample opens its stalled node
    name = samples.node_name(5 if n > 1 else 0)

    async def run_before(pilot):
        app.cluster_state = samples.cluster_state(n, trouble=n > 1)
        screen = NodeScreen(name)
        await app.push_screen(screen)
        screen.post_message(LogRead(LogChunk(0, samples.LOG_LINES)))
        await _settle(pilot)

    assert snap_compare(app, run_before=run_before, terminal_size=size)


def test_node_charts(snap_compare):
    from taehv_console.ui.screens.node import NodeScreen

    app = sample_app()

    async def run_before(pilot):
        app.cluster_state = samples.cluster_state(16, trouble=True)
        await app.push_screen(NodeScreen(samples.node_name(0)))
        await _settle(pilot)
        await pilot.press("c")
        await _settle(pilot)

    assert snap_compare(app, run_before=run_before, terminal_size=(160, 50))


@pytest.mark.parametrize("size", SIZES)
def test_help(snap_compare, size):
    app = sample_app()

    async def run_before(pilot):
        await pilot.press("question_mark")
        await _settle(pilot)

    assert snap_compare(app, run_before=run_before, terminal_size=size)


def test_stop_confirmation(snap_compare):
    from taehv_console.ui.screens.dashboard import DashboardScreen
    from taehv_console.ui.screens.dialogs import ConfirmScreen

    app = sample_app()

    async def run_before(pilot):
        app.cluster_state = samples.cluster_state(16, trouble=True)
        await app.push_screen(DashboardScreen())
        await _settle(pilot)
        await app.push_screen(
            ConfirmScreen(
                "Stop 20251231-121500-derived?",
                "Every node gets SIGTERM: the ranks finish their step and write a "
                "checkpoint (up to 120 s), then whatever is left is killed and the "
                "nodes are checked. Resume later with r.",
                yes="Stop the run",
            )
        )
        await _settle(pilot)

    assert snap_compare(app, run_before=run_before, terminal_size=(80, 24))


@pytest.mark.parametrize("size", SIZES)
def test_start(snap_compare, size):
    assert snap_compare(sample_app(), terminal_size=size)


@pytest.mark.parametrize("size", SIZES)
def test_run_picker(snap_compare, size, monkeypatch):
    from taehv_console.ui.screens.dialogs import RunPickerScreen

    app = sample_app()
    monkeypatch.setattr(app, "refresh_run_list", lambda: None)  # the listing is the sample's, not the disk's

    async def run_before(pilot):
        app.run_entries = (
            RunEntry("20251231-121500-derived", "/shared/runs/20251231-121500-derived", "running", True),
            RunEntry("20251230-080000-8gpu-h100", "/shared/runs/20251230-080000-8gpu-h100", "stopped", False),
            RunEntry("20251229-190000-cpu-smoke", "/shared/runs/20251229-190000-cpu-smoke", "done", False),
        )
        await app.push_screen(RunPickerScreen())
        await _settle(pilot)

    assert snap_compare(app, run_before=run_before, terminal_size=size)


@pytest.mark.parametrize("size", SIZES)
def test_failure_dialog(snap_compare, size):
    from taehv_console.ui.screens.dialogs import MessageScreen

    app = sample_app()

    async def run_before(pilot):
        await app.push_screen(
            MessageScreen(
                "The run failed",
                "node 11 (gpu-node-12) rank 90 (local rank 2) exited 1: CUDA error: out of memory\n\n"
                + "\n".join(samples.LOG_LINES[-2:])
                + "\n\nResume from its newest checkpoint with r.",
            )
        )
        await _settle(pilot)

    assert snap_compare(app, run_before=run_before, terminal_size=size)


def recovered_state():
    """The one-node sample after the console restarted it once: rank 1 was killed at step 12,340."""
    import dataclasses

    from taehv_console.core.models import BackendKind
    from taehv_console.core.run.state import Attempt, Phase, RunState

    state = samples.cluster_state(1)
    t = state.time
    attempts = (
        Attempt(
            number=1,
            started=t - 7200,
            ended=t - 600,
            outcome="failed",
            reached_step=12_340,
            cause="signal",
            decision="restart",
            why="signal: node 0, rank 1: rank 1 was killed by signal 9 (SIGKILL) (retried)",
            blamed_node=0,
            restart_budget=3,
        ),
        Attempt(
            number=2,
            started=t - 590,
            resume="latest",
            from_step=12_000,
            restarted_by="recovery",
            restart_budget=3,
            lost_s=42.0,
            redone_steps=340,
        ),
    )
    console = RunState(
        run_id=state.run.run_id,
        phase=Phase.RUNNING,
        backend=BackendKind.LOCAL,
        hosts=("node-00",),
        attempts=attempts,
    )
    return dataclasses.replace(state, console=console)


@pytest.mark.parametrize("size", [(120, 40)])
def test_dashboard_after_a_recovery(snap_compare, size):
    from taehv_console.ui.screens.dashboard import DashboardScreen

    app = sample_app()

    async def run_before(pilot):
        app.cluster_state = recovered_state()
        await app.push_screen(DashboardScreen())
        await _settle(pilot)

    assert snap_compare(app, run_before=run_before, terminal_size=size)


def test_the_header_and_the_recoveries_pane_say_what_the_restart_cost():
    asyncio.run(_header_and_recoveries())


async def _header_and_recoveries():
    from taehv_console.ui.screens.dashboard import DashboardScreen
    from taehv_console.ui.widgets.panes import RecoveryPane
    from taehv_console.ui.widgets.run_header import header_content

    app = sample_app()
    async with app.run_test(size=(120, 40)) as pilot:
        state = recovered_state()
        app.cluster_state = state
        await app.push_screen(DashboardScreen())
        await _settle(pilot)
        pane = app.screen.query_one(RecoveryPane)
        assert pane.display
        text = str(pane.render())
        assert "signal on node 0: restart" in text and "42s lost, 340 step(s) redone" in text
        header = header_content(state).plain
        assert "restart 1 of 3 (42s lost)" in header
        # a run that never failed shows neither
        app.cluster_state = samples.cluster_state(1)
        await _settle(pilot)
        assert not pane.display
        assert "restart" not in header_content(samples.cluster_state(1)).plain
