"""The run header: phase, preset, the TAE family and the file its weights are exported as, step/max
with a bar, loss, PSNR, clips/s, MFU, ETA and elapsed time, drawn from one ClusterState (its own
`time` is "now", so the same state always draws the same) and the run's family (the app reads it
from run.toml once per run: `rundir.family_fields`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Static

from taehv_console.core.run.recovery import recoveries, restart_text
from taehv_console.core.watch.view import low_mfu, mfu_text
from taehv_console.ui import formatting as f

if TYPE_CHECKING:
    from taehv_console.core.watch.state import RunView


def header_content(
    state: RunView, console_phase: str | None = None, family: dict[str, Any] | None = None
) -> Content:
    run = state.run
    phase = run.phase
    ctrl = console_phase or run.console_phase
    line1: list[str | Content] = [
        Content.styled(run.run_id, "bold"),
        "  ",
        f.badge(phase),
    ]
    if ctrl and ctrl != phase:
        line1 += ["  ", Content.styled(f"console: {ctrl}", "dim")]
    if run.preset:
        line1 += ["  ", Content.styled("preset ", "dim"), run.preset]
    if family:
        exports = family.get("exports") or ["?"]
        line1 += [
            "  ",
            Content.styled("family ", "dim"),
            Content.styled(str(family.get("family")), "bold"),
            Content.styled(f" → {exports[0]}", "dim"),
        ]
    if run.world_size:
        line1 += ["  ", Content.styled("world ", "dim"), str(run.world_size)]
    attempts = state.console.attempts if state.console is not None else ()
    restart = restart_text(attempts)
    if restart:
        line1 += ["  ", Content.styled(restart, f.health_style("degraded"))]
        last = recoveries(attempts)[-1:]
        if last and last[0].lost_s is not None:
            line1 += [Content.styled(f" ({f.duration(last[0].lost_s)} lost)", "dim")]
    step, max_steps = run.step, run.max_steps
    progress: list[str | Content]
    if step is not None and max_steps:
        progress = [
            Content.styled("step ", "dim"),
            Content.styled(f"{step}/{max_steps}", "bold"),
            " ",
            f.progress_bar(step, max_steps, 12),
            f" {100 * step / max_steps:.0f}%",
        ]
    else:
        progress = [Content.styled("step ", "dim"), "-" if step is None else str(step)]
    elapsed = (state.time - run.started) if run.started else None
    line2 = progress + [
        "  ",
        Content.styled("loss ", "dim"),
        f.num(run.loss, ".4g"),
        "  ",
        Content.styled("PSNR ", "dim"),
        f.num(run.psnr, ".2f"),
        " dB",
        "  ",
        f.num(run.clips_per_s, ".3g"),
        Content.styled(" clips/s", "dim"),
        *_mfu(run.mfu),
        "  ",
        Content.styled("ETA ", "dim"),
        f.duration(run.eta_s),
        "  ",
        Content.styled("elapsed ", "dim"),
        f.duration(elapsed),
    ]
    if run.best_val_psnr is not None:
        line2 += ["  ", Content.styled("best val ", "dim"), f.num(run.best_val_psnr, ".2f")]
    if run.stop_reason:
        line2 += ["  ", Content.styled(f"stopped: {run.stop_reason}", f.health_style(phase))]
    return Content("\n").join([Content.assemble(*line1), Content.assemble(*line2)])


def _mfu(mfu: float | None) -> list[str | Content]:
    """'  MFU 21.3 %', in the warning colour below LOW_MFU (the public project's 3-4 % crawl)."""
    if mfu is None:
        return []
    style = f.health_style("warning") if low_mfu(mfu) else "bold"
    return ["  ", Content.styled("MFU ", "dim"), Content.styled(mfu_text(mfu), style)]


class RunHeaderBar(Static):
    """Renders `state` (a ClusterState) and `console_phase` (what this console's controller says)."""

    state: reactive[RunView | None] = reactive(None, always_update=False)
    console_phase: reactive[str | None] = reactive(None)
    family: reactive[dict[str, Any] | None] = reactive(None)

    def watch_family(self, _family: dict[str, Any] | None) -> None:
        self._draw()

    def watch_state(self, state: RunView | None) -> None:
        self._draw()

    def watch_console_phase(self, _phase: str | None) -> None:
        self._draw()

    def _draw(self) -> None:
        # the header's height is fixed by its screen's CSS: no relayout of the screen per state
        if self.state is None:
            self.update(
                Content.styled("no run yet: the wizard starts one (s), or attach to one (a)", "dim"),
                layout=False,
            )
            return
        self.update(header_content(self.state, self.console_phase, self.family), layout=False)
