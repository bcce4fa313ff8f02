"""The Textual app: start-up (attach to a live run, or the wizard), the run this console controls
(launch, follow, stop, resume, attach, all in thread workers over core), themes and keymap.

`make_app()` builds it for the CLI and the tests alike, from the flow's options (core's
FlowOptions: the app never sees the command line). Screens read the newest values from the app
(`cluster_state`, `console_phase`, `run_entries`) and draw them; they never do I/O.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.reactive import var
from textual.screen import Screen
from textual.theme import BUILTIN_THEMES
from textual.worker import Worker, WorkerState

from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.flow.options import FlowOptions
from taehv_console.core.flow.runs import find_live_run, list_run_entries
from taehv_console.core.run.rundir import RunDir, family_fields, resolve_run
from taehv_console.ui.commands import ConsoleCommands
from taehv_console.ui.config import ConsoleConfig, ConsoleConfigError, load_console_config
from taehv_console.ui.errors import USER_ERRORS, error_text
from taehv_console.ui.messages import (
    ClusterUpdated,
    ControlFailed,
    RunAttached,
    RunEnded,
    RunProgressed,
    RunsListed,
)
from taehv_console.ui.screens.dashboard import DashboardScreen
from taehv_console.ui.screens.detect import DetectScreen
from taehv_console.ui.screens.dialogs import ConfirmScreen, MessageScreen, RunPickerScreen, StartScreen
from taehv_console.ui.screens.help import HelpScreen
from taehv_console.ui.screens.node import NodeScreen
from taehv_console.ui.screens.preflight import PreflightScreen
from taehv_console.ui.screens.preset import PresetScreen
from taehv_console.ui.screens.review import ReviewScreen
from taehv_console.ui.screens.samples import SamplesScreen
from taehv_console.ui.session import RunSession
from taehv_console.ui.themes import DEFAULT_THEME, HEALTH_DEFAULTS, ThemeSet, health_variables, load_themes
from taehv_console.ui.widgets.node_grid import NodeGrid
from taehv_console.ui.wizard import WizardState

if TYPE_CHECKING:  # annotations only: flow.launch loads the planner's pydantic models
    from taehv_console.core.flow.launch import Review
    from taehv_console.core.flow.runs import RunEntry
    from taehv_console.core.watch.state import RunView
    from taehv_console.ui.apptype import ConsoleHost


class TaehvConsole(App):
    TITLE = "taehv-console"
    CSS_PATH = "app.tcss"
    COMMANDS = App.COMMANDS | {ConsoleCommands}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "q",
            "quit_console",
            "Quit (run goes on)",
            id="quit",
            tooltip="Leave the console; the run keeps training (attach again with a)",
        ),
        Binding(
            "question_mark",
            "help",
            "Help",
            id="help",
            key_display="?",
            tooltip="Every key and its binding id",
        ),
        Binding("t", "next_theme", "Theme", id="next-theme", tooltip="Next colour theme", show=False),
        Binding("a", "attach", "Attach", id="attach", tooltip="Attach to a run under --runs", show=False),
        Binding("ctrl+q", "quit_console", "Quit", show=False, priority=True, id="quit-now"),
    ]
    MODES: ClassVar[dict[str, Any]] = {"wizard": DetectScreen, "dashboard": DashboardScreen}

    cluster_state: var[RunView | None] = var(None, always_update=True)
    # the shown run's TAE family, its model and export names (rundir.family_fields), read from its
    # run.toml once per run directory; None until read, or where run.toml cannot be read here
    run_family: var[dict[str, Any] | None] = var(None)
    console_phase: var[str | None] = var(None)
    run_entries: var[tuple[RunEntry, ...]] = var(())

    def __init__(
        self,
        options: FlowOptions,
        config: ConsoleConfig,
        themes: ThemeSet,
        theme: str,
        startup: str = "auto",
        pool: SshPool | None = None,
    ) -> None:
        super().__init__()
        self.options = options
        self.console_config = config
        self.themes = themes
        self.initial_theme = theme
        self.startup = startup
        self._pool = pool
        self.session: RunSession | None = None
        self.notes: list[str] = []
        self.started_at = time.monotonic()
        self.first_frame_s: float | None = None
        self.wizard = WizardState()
        self._wizard_shown = False
        self.startup_text = f"looking for a live run in {options.runs} …"
        self._family_dir: str | None = None

    # ------------------------------------------------------------------ set-up
    def get_default_screen(self) -> Screen:
        return StartScreen()

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return {**super().get_theme_variable_defaults(), **health_variables(HEALTH_DEFAULTS)}

    @property
    def theme_names(self) -> tuple[str, ...]:
        return self.themes.names

    @property
    def pool(self) -> SshPool:
        if self._pool is None:
            self._pool = SshPool(self.options.ssh)
        return self._pool

    def on_mount(self) -> None:
        for theme in self.themes.themes:
            self.register_theme(theme)
        self.theme = self.initial_theme
        if self.console_config.keys:
            self.set_keymap(self.console_config.keys)
        for err in self.themes.errors:
            self.notify(err, title="theme file skipped", severity="warning", timeout=10)
        for warning in self.options.warnings:  # cli.main printed them too, hidden by this screen
            self.notify(warning, title="an option given twice", severity="warning", timeout=10)
        self.call_after_refresh(self._first_frame)
        if self.startup == "auto":
            if self.options.run:
                self.attach_run(self.options.run)
            else:
                self._look_for_live_run()
        elif self.startup == "wizard":
            self.start_wizard()

    def _first_frame(self) -> None:
        if self.first_frame_s is None:
            self.first_frame_s = time.monotonic() - self.started_at

    @work(thread=True, group="startup", exit_on_error=False)
    def _look_for_live_run(self) -> None:
        entry = find_live_run(self.options.runs, self.pool)
        self.call_from_thread(self._startup_decided, entry)

    def _startup_decided(self, entry: RunEntry | None) -> None:
        if entry is not None:
            self.notify(f"{entry.run_id} is running: attaching to it", title="live run found")
            self.attach_run(entry.path)
        else:
            self.start_wizard()

    # ------------------------------------------------------------------ screens
    def start_wizard(self) -> None:
        if self.session is not None and self.session.following:
            self.notify(
                "a run is being followed here: stop it (x) or quit (q) before starting another",
                severity="warning",
            )
            return
        self.wizard = WizardState()
        if self.current_mode == "wizard":
            return
        if self._wizard_shown:
            # a fresh wizard (its old steps hold the previous run's choices)
            self.remove_mode("wizard")
            self.add_mode("wizard", DetectScreen)
        self._wizard_shown = True
        self.switch_mode("wizard")

    def show_dashboard(self) -> None:
        if self.current_mode != "dashboard":
            self.switch_mode("dashboard")
        elif self.screen.__class__.__name__ != "DashboardScreen":
            # a node screen or dialog on top: the dashboard is at the bottom of this mode's stack
            while len(self.screen_stack) > 1 and self.screen.__class__.__name__ != "DashboardScreen":
                self.pop_screen()

    def open_node(self, name: str) -> None:
        self.show_dashboard()
        self.push_screen(NodeScreen(name))

    def open_samples(self) -> None:
        """The Samples view of the run shown (its reconstructions at each validation)."""
        if isinstance(self.screen, SamplesScreen):
            return
        state, session = self.cluster_state, self.session
        run_dir = state.run.run_dir if state is not None else (str(session.run.path) if session else None)
        self.push_screen(SamplesScreen(run_dir, images=self.console_config.images))

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(all_bindings()))

    def action_next_theme(self) -> None:
        names = self.theme_names
        i = names.index(self.theme) if self.theme in names else -1
        self.set_console_theme(names[(i + 1) % len(names)])

    def set_console_theme(self, name: str) -> None:
        self.theme = name
        self.notify(f"theme: {name}", timeout=2)

    def action_attach(self) -> None:
        def chosen(path: str | None) -> None:
            if path:
                self.attach_run(path)

        self.push_screen(RunPickerScreen(), chosen)

    async def action_quit_console(self) -> None:
        session = self.session
        if session is not None:
            session.detach()
            self.notify("leaving the console; the run keeps training", timeout=2)
            await asyncio.to_thread(session.close)
            self.session = None
        self.exit()

    async def action_quit(self) -> None:
        await self.action_quit_console()

    # ------------------------------------------------------------------ runs
    def refresh_run_list(self) -> None:
        self._list_runs()

    @work(thread=True, group="runs", exclusive=True, exit_on_error=False)
    def _list_runs(self) -> None:
        self.post_message(RunsListed(list_run_entries(self.options.runs, self.pool)))

    def on_runs_listed(self, message: RunsListed) -> None:
        self.run_entries = message.runs

    def launch_run(self, review: Review) -> None:
        if self.session is not None and self.session.following:
            self.notify("a run is already being followed here", severity="warning")
            return
        self.console_phase = "launching"
        self._launch(review)

    @work(thread=True, group="control", exit_on_error=False)
    def _launch(self, review: Review) -> None:
        self._close_session_from_thread()
        facts = {p.host: p.facts for p in self.wizard.probes if p.facts is not None}
        try:
            session = RunSession.launch(self.options, review, self.pool, facts)
        except USER_ERRORS as err:  # errors.py's one table: named in a dialog, the console goes on
            self.post_message(ControlFailed("launch", error_text(err)))
            return
        self.post_message(RunAttached(session, "launched", session.describe()))
        self._watch_and_follow(session)

    def attach_run(self, path: str) -> None:
        if self.session is not None and self.session.following:
            if str(self.session.run.path) == str(path):
                self.show_dashboard()
                return
            self.notify(
                "this console follows another run: quit (q) and start a console for this one",
                severity="warning",
            )
            return
        self._attach_run(path)

    # named for the worker as before: a failure's dialog says "_attach failed" (MessagePump has an
    # _attach of its own, which this must not override)
    @work(thread=True, group="control", exit_on_error=False, name="_attach")
    def _attach_run(self, path: str) -> None:
        self._close_session_from_thread()
        try:
            run = resolve_run(path, self.options.runs)
            session, how = RunSession.attach(str(run.path), self.pool)
        except USER_ERRORS as err:  # a damaged state.json or run.toml, no such run, another console
            self.post_message(ControlFailed("attach", error_text(err)))
            return
        if how == "live":
            self.post_message(RunAttached(session, "attached", session.describe()))
            self._watch_and_follow(session)
        else:
            self.post_message(RunAttached(session, "ended"))
            self._start_monitor(session)
            self.post_message(RunEnded(session.outcome()))

    def resume_run(self) -> None:
        session = self.session
        if session is None:
            self.notify("no run here to resume: attach to one (a) first", severity="warning")
            return
        if session.following:
            self.notify(f"{session.run.run_id} is running; nothing to resume", severity="warning")
            return
        self.console_phase = "resuming"
        self._resume(session)

    @work(thread=True, group="control", exit_on_error=False)
    def _resume(self, session: RunSession) -> None:
        try:
            point = session.resume()
        except USER_ERRORS as err:
            self.post_message(ControlFailed("resume", error_text(err)))
            return
        lines = (f"resumed from {point.path} (step {point.step})",) + tuple(
            f"not resuming from {s}" for s in point.skipped
        )
        self.post_message(RunAttached(session, "resumed", lines))
        self._follow(session)

    def confirm_stop(self) -> None:
        session = self.session
        if session is None or not session.following:
            self.notify("no run is being followed here: nothing to stop", severity="warning")
            return
        grace = session.grace_s

        def answered(yes: bool | None) -> None:
            if yes and self.session is session:
                self.console_phase = "stopping"
                session.request_stop()

        self.push_screen(
            ConfirmScreen(
                f"Stop {session.run.run_id}?",
                f"Every node gets SIGTERM: the ranks finish their step and write a checkpoint (up to {grace:g} s), "
                "then whatever is left is killed and the nodes are checked. Resume later with r.",
                yes="Stop the run",
            ),
            answered,
        )

    # ------------------------------------------------------------------ thread side
    def _close_session_from_thread(self) -> None:
        old = self.session
        if old is not None:
            self.session = None
            old.close()

    def _start_monitor(self, session: RunSession) -> None:
        session.start_monitor(lambda state: self.post_message(ClusterUpdated(state)))

    def _watch_and_follow(self, session: RunSession) -> None:
        self._start_monitor(session)
        self._follow(session)

    def _follow(self, session: RunSession) -> None:
        outcome = session.follow(lambda snap: self.post_message(RunProgressed(snap)))
        if outcome is not None:
            self.post_message(RunEnded(outcome))

    # ------------------------------------------------------------------ the run's family
    def watch_cluster_state(self, state: RunView | None) -> None:
        run_dir = state.run.run_dir if state is not None else None
        if run_dir == self._family_dir:
            return
        self._family_dir = run_dir
        self.run_family = None
        if run_dir:
            self._read_family(run_dir)

    @work(thread=True, group="family", exclusive=True, exit_on_error=False)
    def _read_family(self, run_dir: str) -> None:
        try:
            family = RunDir(Path(run_dir)).load_config().model.family
        except USER_ERRORS:  # not visible here, or damaged: the header goes without (status names it)
            return
        self.call_from_thread(self._family_read, run_dir, family_fields(family))

    def _family_read(self, run_dir: str, fields: dict[str, Any]) -> None:
        if run_dir == self._family_dir:
            self.run_family = fields

    # ------------------------------------------------------------------ messages
    def on_cluster_updated(self, message: ClusterUpdated) -> None:
        self.cluster_state = message.state

    def on_run_attached(self, message: RunAttached) -> None:
        self.session = message.session
        self.show_dashboard()
        title = {
            "launched": "run launched",
            "attached": "attached",
            "resumed": "resumed",
            "ended": "attached to an ended run",
        }.get(message.how, message.how)
        body = "\n".join((message.run_path, *message.lines))
        self.notify(body, title=f"{title}: {message.run_id}", timeout=6)

    def on_run_progressed(self, message: RunProgressed) -> None:
        snap = message.snapshot
        self.console_phase = snap.phase.value
        for note in snap.notes:
            self.notes.append(note)
            self.notify(note, timeout=5)
        del self.notes[:-200]

    def on_run_ended(self, message: RunEnded) -> None:
        outcome = message.outcome
        self.console_phase = outcome.phase.value
        if outcome.failure is not None:
            self.push_screen(
                MessageScreen(
                    "The run failed",
                    outcome.failure.summary()
                    + (
                        "\n\n" + "\n".join(outcome.failure.log_lines[-12:])
                        if outcome.failure.log_lines
                        else ""
                    )
                    + "\n\nResume from its newest checkpoint with r.",
                )
            )
        elif outcome.phase.value == "stopped":
            step = outcome.stop.checkpoint_step if outcome.stop is not None else None
            where = f"checkpoint at step {step}" if step is not None else "no checkpoint from this stop"
            self.notify(f"stopped: {where}; resume with r", title="run stopped", timeout=8)
        elif outcome.phase.value == "done":
            self.notify(
                f"done; weights in {outcome.final_weights or 'final/'}", title="run finished", timeout=10
            )

    def on_control_failed(self, message: ControlFailed) -> None:
        self.console_phase = self.session.phase.value if self.session is not None else None
        self.push_screen(MessageScreen(f"Could not {message.action}", message.message))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """The app's own workers' failures that the worker did not catch (a screen's come through
        ConsoleScreen: Worker.StateChanged does not bubble)."""
        if event.state is WorkerState.ERROR and event.worker.error is not None:
            self.worker_failed(event.worker.name, event.worker.error)

    def worker_failed(self, name: str | None, err: BaseException) -> None:
        """A dialog naming what failed: a known error (errors.py's table) by its class and message,
        anything else by the crash log that holds its traceback. The console goes on."""
        self.push_screen(MessageScreen(f"{name or 'a background task'} failed", error_text(err)))

    async def on_unmount(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await asyncio.to_thread(session.close)
        if self._pool is not None:
            self._pool.close()


if TYPE_CHECKING:

    def _is_console_host(app: TaehvConsole) -> ConsoleHost:
        return app  # the type checker holds TaehvConsole to what the screens' ConsoleApp promises


# ------------------------------------------------------------------------------------ building


def all_bindings() -> list[tuple[str, Binding]]:
    """(where, Binding) for every binding of the console, in help-screen order."""
    out = []
    for where, cls in (
        ("everywhere", TaehvConsole),
        ("dashboard", DashboardScreen),
        ("node grid", NodeGrid),
        ("node", NodeScreen),
        ("samples", SamplesScreen),
        ("detect", DetectScreen),
        ("preflight", PreflightScreen),
        ("preset", PresetScreen),
        ("review", ReviewScreen),
        ("dialogs", ConfirmScreen),
    ):
        for b in cls.BINDINGS:
            if isinstance(b, Binding) and b.id:
                out.append((where, b))
    return out


def binding_ids() -> set[str]:
    return {b.id for _, b in all_bindings() if b.id}


def resolve_theme(requested: str | None, themes: ThemeSet) -> str:
    name = requested or DEFAULT_THEME
    if name not in themes.names and name not in BUILTIN_THEMES:
        raise ConsoleConfigError(
            f"unknown theme {name!r}; themes: {', '.join(themes.names)} "
            "(or a file in ~/.config/taehv-console/themes/)"
        )
    return name


def make_app(
    options: FlowOptions | None = None,
    *,
    theme: str | None = None,
    startup: str = "auto",
    config: ConsoleConfig | None = None,
    pool: SshPool | None = None,
) -> TaehvConsole:
    """The console for these flow options (`cli.console_options(argv)` makes them from a command
    line); `theme` as given on the command line wins over the settings file's.
    `startup`: auto (attach to a live run, else the wizard), wizard, or none (tests push screens)."""
    if config is None:
        config = load_console_config(binding_ids=binding_ids())
    themes = load_themes()
    chosen_theme = resolve_theme(theme or config.theme, themes)
    return TaehvConsole(options or FlowOptions(), config, themes, chosen_theme, startup=startup, pool=pool)


def run_console(options: FlowOptions, theme: str | None = None) -> int:
    """`taehv-console` with no subcommand: the TUI. Returns the process exit status."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print("taehv-console: no terminal here; use --no-tui for the headless flow", file=sys.stderr)
        return 2
    try:
        app = make_app(options, theme=theme)
    except ConsoleConfigError as err:
        print(f"taehv-console: {err}", file=sys.stderr)
        return 2
    app.run()
    return int(app.return_code or 0)
