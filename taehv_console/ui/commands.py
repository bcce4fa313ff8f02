"""Command palette entries (ctrl+p) for the console's actions: attach to a run, switch theme, open
node N, samples, stop, resume, start, help. Entries depend on what the console knows now: the runs it
listed, the nodes of the newest ClusterState, whether a run is being followed. No I/O here: the
run list is the one a worker fetched last (refreshed when the palette opens)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from taehv_console.ui.apptype import ConsoleApp


class ConsoleCommands(Provider):
    if TYPE_CHECKING:

        @property
        def app(self) -> ConsoleApp: ...

    async def startup(self) -> None:
        self.app.refresh_run_list()

    def _commands(self) -> list[tuple[str, Callable[[], Any], str]]:
        app = self.app
        out: list[tuple[str, Callable[[], Any], str]] = []
        session = app.session
        if session is not None and session.following:
            out.append(
                ("Stop the run", app.confirm_stop, "SIGTERM every node, checkpoint, verify nothing is left")
            )
        elif session is not None:
            out.append(("Resume the run", app.resume_run, "relaunch from the newest complete checkpoint"))
        out.append(("Start a new run", app.start_wizard, "the wizard: detect, preflight, preset, review"))
        for entry in app.run_entries:
            what = "running" if entry.live else entry.phase
            out.append(
                (
                    f"Attach to run {entry.run_id}",
                    partial(app.attach_run, entry.path),
                    f"{what}; {entry.path}",
                )
            )
        for name in app.theme_names:
            out.append(
                (f"Switch theme: {name}", partial(app.set_console_theme, name), "colours from themes/*.toml")
            )
        state = app.cluster_state
        if state is not None:
            for i, node in enumerate(state.nodes):
                out.append(
                    (
                        f"Open node {i}: {node.name}",
                        partial(app.open_node, node.name),
                        f"{node.state.value}; per-GPU table, ranks, log, charts",
                    )
                )
        if state is not None or session is not None:
            out.append(
                (
                    "Show samples (reconstructions)",
                    app.open_samples,
                    "each validation's input, reconstruction and error, clip by clip; compare steps",
                )
            )
        out.append(("Show keys (help)", app.action_help, "every key binding, with the id to rebind it"))
        return out

    async def discover(self) -> Hits:
        for name, callback, help_text in self._commands():
            yield DiscoveryHit(name, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for name, callback, help_text in self._commands():
            score = matcher.match(name)
            if score > 0:
                yield Hit(score, matcher.highlight(name), callback, help=help_text)
