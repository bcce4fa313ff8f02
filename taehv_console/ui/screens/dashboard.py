"""The dashboard: run header, node grid, loss and PSNR sparklines, checkpoints and notable events,
all drawn from the newest ClusterState. Stop (confirmed), resume, attach, start and the Samples
view live here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, Input

from taehv_console.ui.screens.node import NodeScreen
from taehv_console.ui.widgets.node_grid import NodeGrid
from taehv_console.ui.widgets.panes import CheckpointPane, MetricSpark, NoticePane, RecoveryPane
from taehv_console.ui.widgets.run_header import RunHeaderBar

if TYPE_CHECKING:
    from textual import getters

    from taehv_console.core.watch.state import RunView
    from taehv_console.ui.apptype import ConsoleApp


class DashboardScreen(Screen):
    if TYPE_CHECKING:
        app = getters.app(ConsoleApp)

    CSS_PATH = "dashboard.tcss"
    # textual declares it "ClassVar[...] | None", which mypy reads as an instance variable
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-narrow"), (120, "-wide")]  # type: ignore[misc]
    AUTO_FOCUS = "NodeCell"  # a cell, never the hidden filter box (it would swallow letter keys)
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "s",
            "start_run",
            "Start",
            id="start",
            tooltip="Start a new run: the wizard (detect, preflight, preset, review)",
        ),
        Binding("x", "stop_run", "Stop", id="stop", tooltip="Stop the run after a checkpoint (asks first)"),
        Binding(
            "r", "resume_run", "Resume", id="resume", tooltip="Relaunch from the newest complete checkpoint"
        ),
        Binding(
            "v",
            "show_samples",
            "Samples",
            id="show-samples",
            tooltip="What the model learned: each validation's input, reconstruction and error",
        ),
        Binding(
            "slash",
            "filter_nodes",
            "Filter",
            id="filter-nodes",
            key_display="/",
            show=False,  # in help (?): an 80-column footer keeps "Quit (run goes on)" whole
            tooltip="Show only nodes whose name or state contains the text",
        ),
        Binding("escape", "clear_filter", "Clear filter", show=False, id="back"),
    ]

    def compose(self) -> ComposeResult:
        yield RunHeaderBar(id="run-header")
        with Horizontal(id="main"):
            with Vertical(id="nodes-pane"):
                yield Input(
                    placeholder="filter nodes: name or state (enter keeps, escape clears)", id="node-filter"
                )
                yield NodeGrid(id="node-grid")
            with Vertical(id="side"):
                yield MetricSpark("loss", ".4g", id="loss-spark")
                yield MetricSpark("PSNR", ".2f", " dB", id="psnr-spark")
                yield MetricSpark("clips/s", ".3g", id="clips-spark")
                yield CheckpointPane(id="checkpoints")
                yield RecoveryPane(id="recoveries")
        yield NoticePane(id="notices")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#nodes-pane").border_title = "nodes"
        self.query_one("#side").border_title = "training"
        self.query_one("#checkpoints").border_title = "checkpoints"
        self.query_one("#recoveries").border_title = "recoveries"
        self.query_one("#notices").border_title = "events"
        self.watch(self.app, "cluster_state", self._show_state)
        self.watch(self.app, "console_phase", self._show_phase)
        self.watch(self.app, "run_family", self._show_family)

    def on_screen_resume(self) -> None:
        self._show_state(self.app.cluster_state)

    def _show_state(self, state: RunView | None) -> None:
        if state is None or not self.is_current:
            return  # an inactive screen draws nothing; it catches up on resume
        self.query_one(RunHeaderBar).state = state
        grid = self.query_one(NodeGrid)
        grid.update_state(state)
        self.query_one("#loss-spark", MetricSpark).series = state.history.loss
        self.query_one("#psnr-spark", MetricSpark).series = state.history.psnr
        self.query_one("#clips-spark", MetricSpark).series = state.history.clips_per_s
        self.query_one(CheckpointPane).state = state
        self.query_one(RecoveryPane).state = state
        self.query_one(NoticePane).state = state
        self.query_one("#nodes-pane").border_subtitle = f"{len(state.nodes)} node(s)"
        if self.focused is None:
            self.call_after_refresh(grid.focus_first)

    def _show_phase(self, phase: str | None) -> None:
        self.query_one(RunHeaderBar).console_phase = phase

    def _show_family(self, family: dict[str, Any] | None) -> None:
        self.query_one(RunHeaderBar).family = family

    # ---------------------------------------------------------------- nodes
    def on_node_grid_node_chosen(self, message: NodeGrid.NodeChosen) -> None:
        self.app.push_screen(NodeScreen(message.name))

    def action_filter_nodes(self) -> None:
        box = self.query_one("#node-filter", Input)
        box.display = True
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "node-filter":
            self.query_one(NodeGrid).filter_text = event.value

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "node-filter":
            self.query_one(NodeGrid).focus_first()
            if not event.value:
                event.input.display = False

    def action_clear_filter(self) -> None:
        box = self.query_one("#node-filter", Input)
        box.value = ""
        box.display = False
        self.query_one(NodeGrid).filter_text = ""
        self.query_one(NodeGrid).focus_first()

    # ---------------------------------------------------------------- control
    def action_start_run(self) -> None:
        self.app.start_wizard()

    def action_stop_run(self) -> None:
        self.app.confirm_stop()

    def action_resume_run(self) -> None:
        self.app.resume_run()

    def action_show_samples(self) -> None:
        self.app.open_samples()
