"""Help: every key of the console with the binding id that rebinds it, where it applies, and how
to change it (the settings file's path and format)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.screen import ModalScreen
from textual.widgets import DataTable, Footer, Static

from taehv_console.ui import formatting as f
from taehv_console.ui.config import config_path

if TYPE_CHECKING:
    from textual import getters

    from taehv_console.ui.apptype import ConsoleApp


class HelpScreen(ModalScreen[None]):
    if TYPE_CHECKING:
        app = getters.app(ConsoleApp)

    CSS_PATH = "help.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "close", "Close", id="close-help", key_display="esc")
    ]

    def __init__(self, bindings: Sequence[tuple[str, Binding]]) -> None:
        """`bindings`: (where, Binding) of every key of the console, in the order shown."""
        super().__init__()
        self.bindings = tuple(bindings)

    def compose(self) -> ComposeResult:
        with Vertical(id="help"):
            yield Static(Content.styled("Keys", "bold"), id="help-title")
            yield DataTable(id="keys", cursor_type="none", zebra_stripes=True, show_cursor=False)
            yield Static("", id="help-config")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        app = self.app
        keymap = app.console_config.keys
        table = self.query_one("#keys", DataTable)
        table.add_columns("key", "binding id", "where", "does")
        for where, b in self.bindings:
            keys = keymap.get(b.id, b.key) if b.id else b.key
            shown = ", ".join(
                app.get_key_display(
                    Binding(k, b.action, key_display=None if b.id in keymap else b.key_display)
                )
                for k in keys.split(",")
            )
            table.add_row(
                *f.table_row(
                    (Content.styled(shown, "bold $accent"), b.id or "", where, b.tooltip or b.description)
                )
            )
        table.add_row(
            *f.table_row(
                (
                    Content.styled("ctrl+p", "bold $accent"),
                    "",
                    "everywhere",
                    "command palette: attach, theme, open node N, samples, stop, resume",
                )
            )
        )
        path = app.console_config.path or config_path()
        self.query_one("#help-config", Static).update(
            Content.assemble(
                Content.styled("Rebind keys ", "bold"),
                "in ",
                Content.styled(str(path), "$accent"),
                ": ",
                Content.styled('[keys] stop = "ctrl+x"', "bold"),
                " (binding id = key; several keys comma-separated), ",
                Content.styled('theme = "light"', "bold"),
                ".\n",
                Content.styled("q", "bold $accent"),
                " leaves the console only: the run keeps training, and the next console attaches to it.",
            )
        )

    def action_close(self) -> None:
        self.dismiss(None)
