"""Small modal screens: a yes/no confirmation (stop, trust a host key), a message for a refused
or failed action, the run picker behind `a` (attach), and the start-up screen."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, DataTable, Footer, Static

from taehv_console.ui import formatting as f

if TYPE_CHECKING:
    from textual import getters

    from taehv_console.core.flow.runs import RunEntry
    from taehv_console.ui.apptype import ConsoleApp


class ConfirmScreen(ModalScreen[bool]):
    CSS_PATH = "dialogs.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "answer(True)", "Yes", id="confirm-yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm-no"),
    ]

    def __init__(self, title: str, body: str, yes: str = "Yes", no: str = "Cancel") -> None:
        super().__init__()
        self.title_text = title
        self.body = body
        self.yes = yes
        self.no = no

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(self.title_text, id="dialog-title")
            yield Static(self.body, id="dialog-body")
            with Horizontal(id="dialog-buttons"):
                yield Button(f"{self.yes} (y)", variant="error", id="yes")
                yield Button(f"{self.no} (n)", id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class MessageScreen(ModalScreen[None]):
    """What went wrong (or what happened) and what to do; any key closes it."""

    CSS_PATH = "dialogs.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,enter,q", "close", "Close", id="close-dialog")]

    def __init__(self, title: str, body: str, severity: str = "error") -> None:
        super().__init__()
        self.title_text = title
        self.body = body
        self.severity = severity

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes=f"-{self.severity}"):
            yield Static(self.title_text, id="dialog-title")
            yield Static(self.body, id="dialog-body", markup=False)
            with Horizontal(id="dialog-buttons"):
                yield Button("Close (esc)", id="close")

    def on_mount(self) -> None:
        self.query_one("#close", Button).focus()

    def on_button_pressed(self, _event: Button.Pressed) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)


class RunPickerScreen(ModalScreen[str | None]):
    """Runs under --runs, newest first, live ones marked; enter attaches."""

    if TYPE_CHECKING:
        app = getters.app(ConsoleApp)

    CSS_PATH = "dialogs.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss_picker", "Back", id="back")]

    def compose(self) -> ComposeResult:
        with Vertical(id="picker"):
            yield Static("Attach to a run", id="dialog-title")
            yield DataTable(id="runs", cursor_type="row", zebra_stripes=True)
            yield Static("", id="picker-hint")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns("run", "phase", "live")
        self.watch(self.app, "run_entries", self._show)
        self.app.refresh_run_list()

    def _show(self, entries: tuple[RunEntry, ...]) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for e in entries:
            table.add_row(
                *f.table_row(
                    (
                        e.run_id,
                        f.badge(e.phase) if e.phase in f.HEALTH_BADGES else e.phase,
                        f.badge("running") if e.live else "-",
                    )
                ),
                key=e.path,
            )
        hint = self.query_one("#picker-hint", Static)
        hint.update(
            f"{len(entries)} run(s) in {self.app.options.runs}; enter attaches"
            if entries
            else f"no runs in {self.app.options.runs} yet"
        )
        table.focus()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.dismiss(event.row_key.value)

    def action_dismiss_picker(self) -> None:
        self.dismiss(None)


class StartScreen(Screen):
    """The first frame: what the console is doing while it looks for a live run."""

    if TYPE_CHECKING:
        app = getters.app(ConsoleApp)

    CSS_PATH = "dialogs.tcss"

    def compose(self) -> ComposeResult:
        yield Static("taehv-console", id="start-title")
        yield Static("", id="start-status")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#start-status", Static).update(self.app.startup_text)
