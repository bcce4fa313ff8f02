"""The console's screens' base: a screen's thread worker that raises is said in the app's dialog.

Textual's Worker.StateChanged does not bubble: a worker started by a screen reports its end to that
screen alone, and one whose error nobody handles fails silently (a preset that cannot be read left
the preflight step on "checking …" for good). Every screen with workers derives from ConsoleScreen,
which hands the error to the app (`worker_failed`): a known error (errors.py's table) by its class
and message, anything else by its crash log; the console goes on either way."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.screen import Screen
from textual.worker import Worker, WorkerState

if TYPE_CHECKING:
    from textual import getters

    from taehv_console.ui.apptype import ConsoleApp


class ConsoleScreen(Screen):
    if TYPE_CHECKING:
        app = getters.app(ConsoleApp)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state is WorkerState.ERROR and event.worker.error is not None:
            self.app.worker_failed(event.worker.name, event.worker.error)
