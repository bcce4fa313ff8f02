"""The console app as its screens and the command palette use it, for the type checker: Textual's
App plus what ui.app.TaehvConsole adds (ConsoleHost). A screen cannot import ui.app, not even for
annotations: app imports every screen, and the import contracts forbid the cycle. So screens
declare `app = getters.app(ConsoleApp)` under TYPE_CHECKING, and ui.app checks that TaehvConsole
implements ConsoleHost. Nothing here runs but the Protocol's definition."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from textual.app import App

    from taehv_console.core.cluster.ssh import SshPool
    from taehv_console.core.flow.launch import Review
    from taehv_console.core.flow.options import FlowOptions
    from taehv_console.core.flow.runs import RunEntry
    from taehv_console.core.watch.state import RunView
    from taehv_console.ui.config import ConsoleConfig
    from taehv_console.ui.session import RunSession
    from taehv_console.ui.wizard import WizardState


class ConsoleHost(Protocol):
    """What TaehvConsole adds to Textual's App that screens and commands read or call."""

    options: FlowOptions
    console_config: ConsoleConfig
    wizard: WizardState
    session: RunSession | None
    cluster_state: RunView | None
    run_family: dict[str, Any] | None  # status.family_fields of the run shown, once run.toml is read
    run_entries: tuple[RunEntry, ...]
    startup_text: str

    @property
    def pool(self) -> SshPool: ...

    @property
    def theme_names(self) -> tuple[str, ...]: ...

    def refresh_run_list(self) -> None: ...
    def start_wizard(self) -> None: ...
    def launch_run(self, review: Review) -> None: ...
    def attach_run(self, path: str) -> None: ...
    def confirm_stop(self) -> None: ...
    def resume_run(self) -> None: ...
    def open_node(self, name: str) -> None: ...
    def open_samples(self) -> None: ...
    def set_console_theme(self, name: str) -> None: ...
    def action_help(self) -> None: ...
    def worker_failed(self, name: str | None, err: BaseException) -> None: ...


if TYPE_CHECKING:

    class ConsoleApp(App[object], ConsoleHost):
        """The type of `self.app` in the console's screens."""
