"""A node without GPUs: the Detect table's GPU cell and the node screen's GPU table say why in words
that fit (never a reason cut mid-word), and i shows the whole reason in a dialog."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from taehv_console.core.models import ProbeResult
from taehv_console.ui import formatting as f
from tests.ui import samples
from tests.ui.conftest import sample_app, wait_until

# what the probe says on a machine without the NVIDIA driver (core/cluster/probe.py: nvml)
NVML_MISSING = "NVML unavailable: NVML Shared Library Not Found"


@pytest.mark.parametrize(
    "reason, words",
    [
        (NVML_MISSING, "no NVML"),
        ("nvidia-ml-py is not installed (No module named 'pynvml')", "no nvidia-ml-py"),
        ("NVML query failed: Unknown Error", "NVML failed"),
        ("NVML found no GPU", "none found"),
        ("CUDA_VISIBLE_DEVICES='' hides every GPU", "all hidden"),
        ("", "none visible"),
        ("the driver and the kernel module disagree: 550 vs 535", "the driver and…"),
    ],
)
def test_no_gpu_words_are_whole_words_that_fit(reason, words):
    assert f.no_gpu_words(reason) == words
    assert len(words) <= 16


def _no_gpu_probe() -> ProbeResult:
    p = samples.probes(1)[0]
    assert p.facts is not None
    facts = dataclasses.replace(p.facts, gpus=(), visible_gpu_indices=(), gpu_reason=NVML_MISSING)
    return dataclasses.replace(p, facts=facts)


def _dialog_body(app) -> str:
    return str(app.screen.query_one("#dialog-body").render())


def test_detect_says_no_nvml_and_i_shows_the_whole_reason():
    from textual.widgets import DataTable

    from taehv_console.ui.screens.detect import DetectScreen

    app = sample_app()

    async def go():
        async with app.run_test(size=(120, 30)) as pilot:
            app.wizard.topology, app.wizard.probes = samples.topology(1), (_no_gpu_probe(),)
            await app.push_screen(DetectScreen())
            await pilot.pause()
            table = app.screen.query_one("#nodes", DataTable)
            cell = str(table.get_row_at(0)[2])
            assert cell == "0 — no NVML"
            assert "NVML Shared" not in cell
            assert app.screen.check_action("gpu_reason", ()) is True  # i is offered in the footer
            await pilot.press("i")
            await wait_until(pilot, lambda: type(app.screen).__name__ == "MessageScreen", 10, "the dialog")
            assert _dialog_body(app) == NVML_MISSING
            await pilot.press("escape")
            await wait_until(pilot, lambda: type(app.screen).__name__ == "DetectScreen", 10, "Detect again")

    asyncio.run(go())


def test_the_node_screen_says_no_nvml_and_i_shows_the_whole_reason():
    from textual.widgets import DataTable

    from taehv_console.ui.screens.node import NodeScreen

    state = samples.cluster_state(1)
    node = state.nodes[0]
    assert node.sample is not None
    sample = dataclasses.replace(node.sample, gpu_ok=False, gpus=(), gpu_reason=NVML_MISSING)
    state = dataclasses.replace(state, nodes=(dataclasses.replace(node, sample=sample),))
    app = sample_app()

    async def go():
        async with app.run_test(size=(120, 30)) as pilot:
            app.cluster_state = state
            await app.push_screen(NodeScreen(node.name))
            await pilot.pause()
            table = app.screen.query_one("#gpus", DataTable)
            assert str(table.get_row_at(0)[1]) == "no GPU — no NVML"
            assert app.screen.check_action("gpu_reason", ()) is True
            await pilot.press("i")
            await wait_until(pilot, lambda: type(app.screen).__name__ == "MessageScreen", 10, "the dialog")
            assert _dialog_body(app) == NVML_MISSING

    asyncio.run(go())


def test_i_is_offered_only_where_a_node_has_no_gpu():
    from taehv_console.ui.screens.detect import DetectScreen
    from taehv_console.ui.screens.node import NodeScreen

    app = sample_app()

    async def go():
        async with app.run_test(size=(120, 30)) as pilot:
            app.wizard.topology, app.wizard.probes = samples.topology(1), samples.probes(1)  # 8 GPUs
            await app.push_screen(DetectScreen())
            await pilot.pause()
            assert app.screen.check_action("gpu_reason", ()) is False
            app.cluster_state = samples.cluster_state(1)
            await app.push_screen(NodeScreen(samples.node_name(0)))
            await pilot.pause()
            assert app.screen.check_action("gpu_reason", ()) is False
            await pilot.press("i")
            await pilot.pause()
            assert type(app.screen).__name__ == "NodeScreen"  # no dialog

    asyncio.run(go())
