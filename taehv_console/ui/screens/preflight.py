"""Wizard step 2, Preflight: core's checks on the detected nodes for the chosen config, findings
grouped by severity with the fix for each. Errors block continuing; `r` runs the checks again."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.widgets import Footer, Static

from taehv_console.ui.formatting import findings_content
from taehv_console.ui.messages import NoteAdded, PreflightFinished
from taehv_console.ui.screens.base import ConsoleScreen
from taehv_console.ui.screens.preset import PresetScreen
from taehv_console.ui.widgets.steps import WizardSteps

if TYPE_CHECKING:
    from textual import getters

    from taehv_console.core.flow.preflight import PreflightResult
    from taehv_console.ui.apptype import ConsoleApp


class PreflightScreen(ConsoleScreen):
    if TYPE_CHECKING:
        app = getters.app(ConsoleApp)

    CSS_PATH = "wizard.tcss"
    # textual declares it "ClassVar[...] | None", which mypy reads as an instance variable
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-narrow"), (100, "-wide")]  # type: ignore[misc]
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "next_step", "Continue", id="next-step", tooltip="Choose the preset"),
        Binding("r", "rerun", "Run again", id="rerun-preflight", tooltip="Run every check again"),
        Binding(
            "b",
            "rerun(True)",
            "Bandwidth",
            id="measure-bandwidth",
            tooltip="Run the checks again and measure the all-reduce bandwidth between the nodes",
        ),
        Binding("escape", "back", "Back", id="back", tooltip="Previous step"),
    ]

    def compose(self) -> ComposeResult:
        yield WizardSteps(1, classes="steps")
        yield Static("", id="config")
        yield Static("", id="notes")
        with VerticalScroll(id="findings"):
            yield Static("", id="findings-text")
        yield Static("", id="verdict")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#findings").border_title = "findings"
        result = self.app.wizard.preflight
        if result is not None:
            self._show(result)
        else:
            self.action_rerun()

    def action_rerun(self, bandwidth: bool = False) -> None:
        self.app.wizard.preflight = None
        self._notes: list[str] = []
        self.query_one("#notes", Static).update("")
        self.query_one("#findings-text", Static).update(
            Content.styled("checking and measuring the bandwidth …" if bandwidth else "checking …", "dim")
        )
        self.query_one("#verdict", Static).update("")
        self._run(bandwidth)

    # named: a preset that cannot be read fails here, and the app's dialog says "preflight failed"
    @work(thread=True, exclusive=True, group="preflight", exit_on_error=False, name="preflight")
    def _run(self, bandwidth: bool = False) -> None:
        # the planner's pydantic models (~0.5 s) load here, in the worker: the first frame never waits
        from taehv_console.core.flow.config import run_config
        from taehv_console.core.flow.preflight import preflight

        w = self.app.wizard
        assert w.topology is not None  # the detect screen moves on only with a topology
        options = self.app.options

        def note(text: str) -> None:
            self.post_message(NoteAdded(text))

        chosen = w.chosen or run_config(options, w.topology, w.probes, note=note)
        result = preflight(options, w.topology, w.probes, chosen, self.app.pool, note, bandwidth=bandwidth)
        self.post_message(PreflightFinished(result, chosen))

    def on_note_added(self, message: NoteAdded) -> None:
        self._notes = (getattr(self, "_notes", []) + [message.text])[-3:]
        self.query_one("#notes", Static).update("\n".join(f"… {n}" for n in self._notes))

    def on_preflight_finished(self, message: PreflightFinished) -> None:
        self.app.wizard.preflight = message.result
        if self.app.wizard.chosen is None:
            self.app.wizard.chosen = message.chosen
        self._show(message.result)

    def _show(self, result: PreflightResult) -> None:
        report = result.report
        bw = report.bandwidth
        link = (
            f"{bw.busbw_gbps * 8:.1f} Gbit/s measured ({bw.backend}, {bw.nodes} nodes)"
            if bw is not None
            else "not measured (b measures it)"
        )
        self.query_one("#config", Static).update(
            Content.assemble(
                Content.styled("config ", "dim"),
                result.chosen,
                "\n",
                Content.styled("master port ", "dim"),
                str(result.master_port or "-"),
                Content.styled("  backend ", "dim"),
                result.backend.value if result.backend is not None else "none",
                Content.styled("  bandwidth ", "dim"),
                link,
            )
        )
        self.query_one("#notes", Static).update("")
        self.query_one("#findings-text", Static).update(findings_content(report.findings))
        verdict = self.query_one("#verdict", Static)
        n_err = len(report.errors)
        n_warn = sum(1 for x in report.findings if x.severity.value == "warning")
        ok = sum(1 for p in report.probes if p.ok)
        if n_err:
            verdict.update(
                f"{n_err} error(s), {n_warn} warning(s) on {ok} of {len(report.probes)} node(s): "
                "fix them, then run the checks again (r)"
            )
        else:
            verdict.update(
                f"ready: {n_warn} warning(s) on {ok} of {len(report.probes)} node(s); continue (n)"
            )
        verdict.set_class(bool(n_err), "-blocked")
        verdict.set_class(not n_err, "-ready")

    def action_next_step(self) -> None:
        result = self.app.wizard.preflight
        if result is None:
            self.notify("the checks are still running", severity="warning")
            return
        if not result.report.ok:
            self.notify(
                f"{len(result.report.errors)} error(s) block the launch: fix them and run again (r)",
                severity="error",
            )
            return
        self.app.push_screen(PresetScreen())

    def action_back(self) -> None:
        self.app.pop_screen()
