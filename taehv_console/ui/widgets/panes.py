"""The dashboard's side panes, each drawn from a ClusterState: loss/PSNR sparklines, checkpoints
(last complete, in progress, next due, incomplete ones flagged) and notable events."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Sparkline, Static

from taehv_console.core.run.recovery import recoveries
from taehv_console.ui import formatting as f

if TYPE_CHECKING:
    from taehv_console.core.watch.state import RunView, Series


class MetricSpark(Vertical):
    """A titled sparkline of one Series with its last, min and max values."""

    series: reactive[Series | None] = reactive(None, always_update=False)

    def __init__(self, title: str, fmt: str = ".4g", unit: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.title = title
        self.fmt = fmt
        self.unit = unit

    def compose(self) -> ComposeResult:
        yield Static(self.title, classes="metric-title")
        yield Sparkline([], summary_function=max, classes="metric-spark")

    def watch_series(self, series: Series | None) -> None:
        values = list(series.values) if series is not None else []
        label = self.query_one(".metric-title", Static)
        spark = self.query_one(Sparkline)
        # no line until there is data (a sparkline of [0.0] draws solid blocks); one value draws
        # as a flat line, not as a wall of full blocks
        spark.display = bool(values)
        spark.data = values[-240:] if len(values) != 1 else values * 2
        if not values:
            label.update(
                Content.assemble(Content.styled(self.title, "bold"), Content.styled("  no data yet", "dim")),
                layout=False,
            )
            return
        label.update(
            Content.assemble(
                Content.styled(self.title, "bold"),
                "  ",
                Content.styled(format(values[-1], self.fmt) + self.unit, "$accent"),
                Content.styled(f"  min {min(values):{self.fmt}}  max {max(values):{self.fmt}}", "dim"),
            ),
            layout=False,
        )


def checkpoint_content(state: RunView) -> Content:
    c = state.checkpoints
    lines: list[Content] = []
    complete = c.complete
    if complete:
        last = complete[0]
        lines.append(
            Content.assemble(
                Content.styled("last   ", "dim"),
                f.badge("complete"),
                f"  step {last.step}",
                Content.styled(f"  {f.size(last.bytes)}  {f.age(last.age_s)} ago", "dim"),
            )
        )
    else:
        lines.append(
            Content.assemble(Content.styled("last   ", "dim"), Content.styled("none complete yet", "dim"))
        )
    for item in c.items:
        if item.state.value == "in_progress":
            lines.append(
                Content.assemble(
                    Content.styled("now    ", "dim"),
                    Content.styled(f"writing step {item.step}", f.health_style("in_progress")),
                )
            )
    due: list[str | Content] = [
        Content.styled("next   ", "dim"),
        f"step {c.next_due_step}" if c.next_due_step is not None else "-",
    ]
    if c.every:
        due.append(Content.styled(f"  (every {c.every})", "dim"))
    lines.append(Content.assemble(*due))
    if len(complete) > 1:
        lines.append(Content.styled("kept   " + ", ".join(str(x.step) for x in complete[:6]), "dim"))
    for item in c.items:
        if item.state.value == "incomplete":
            why = "; ".join(item.problems)[:60] or "incomplete"
            lines.append(
                Content.assemble(f.badge("incomplete"), f"  {item.name}: ", Content.styled(why, "dim"))
            )
    for p in c.problems[:3]:
        lines.append(Content.styled(p[:80], f.health_style("warning")))
    return Content("\n").join(lines)


class CheckpointPane(Static):
    state: reactive[RunView | None] = reactive(None, always_update=False)
    _lines = -1

    def watch_state(self, state: RunView | None) -> None:
        if state is not None:
            content = checkpoint_content(state)
            lines = content.plain.count("\n")
            # relayout only when the pane's height changes (a checkpoint appears, one goes bad)
            self.update(content, layout=lines != self._lines)
            self._lines = lines


def notice_content(state: RunView, limit: int = 40) -> Content:
    """Newest first: what needs attention is on top without scrolling."""
    if not state.notices:
        return Content.styled("nothing notable yet", "dim")
    lines = []
    for n in reversed(state.notices[-limit:]):
        ago = f.duration(state.time - n.time) if n.time else "-"
        where = f" {n.node}" if n.node else ""
        where += f" r{n.rank}" if n.rank is not None else ""
        lines.append(
            Content.assemble(
                Content.styled(f"{ago:>6} ", "dim"),
                Content.styled(f"{n.severity:<7}", f"bold {f.health_style(n.severity)}"),
                Content.styled(f" {n.source}{where}: ", "dim"),
                n.text,
            )
        )
    return Content("\n").join(lines)


class NoticePane(Static):
    state: reactive[RunView | None] = reactive(None, always_update=False)

    def watch_state(self, state: RunView | None) -> None:
        if state is not None:
            self.update(notice_content(state), layout=False)  # a fixed height: no relayout


def recovery_content(state: RunView) -> Content:
    """One line per failure the console judged, newest first: when, cause, node, what it did, and
    what the restart cost; under a node left out, which host and what took its place."""
    attempts = state.console.attempts if state.console is not None else ()
    excluded = {e.attempt: e for e in state.console.exclusions} if state.console is not None else {}
    lines = []
    for r in reversed(recoveries(attempts)):
        ago = f.duration(state.time - r.time) if r.time else "-"
        node = f" on node {r.node}" if r.node is not None else ""
        lines.append(
            Content.assemble(
                Content.styled(f"{ago:>6} ", "dim"),
                Content.styled(r.cause, f.health_style("degraded")),
                f"{node}: {r.action}",
            )
        )
        e = excluded.get(r.attempt)
        if e is not None:
            instead = (
                f"spare {e.replaced_by} in its place" if e.replaced_by else f"{e.nodes_after} node(s) go on"
            )
            lines.append(Content.styled(f"       {e.host} left out: {instead}", "dim"))
        if r.lost_s is not None:
            lost = f"{f.duration(r.lost_s)} lost, {r.redone_steps} step(s) redone"
            lines.append(Content.styled(f"       {lost}", "dim"))
    return Content("\n").join(lines)


class RecoveryPane(Static):
    """The run's recoveries; shown only once there is one."""

    state: reactive[RunView | None] = reactive(None, always_update=False)

    def watch_state(self, state: RunView | None) -> None:
        if state is None:
            return
        content = recovery_content(state)
        self.display = bool(content.plain)
        if self.display:
            self.update(content)
