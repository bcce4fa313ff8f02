"""The node grid: one compact cell per node (health badge, per-GPU utilisation and memory as
one column per GPU, temperature and power, ranks, straggler score, heartbeat age), laid out in
as many columns as the pane is wide and scrolling past the screen: 1 node or 64 stay readable.
Arrow keys move between cells, enter opens the node, `/` filters by name or state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget

from taehv_console.ui import formatting as f

if TYPE_CHECKING:
    from textual import events

    from taehv_console.core.watch.state import NodeSnapshot, RankHealth, RunView

CELL_WIDTH = 27  # columns per cell, borders included; the grid fits width // CELL_WIDTH of them
CELL_HEIGHT = 6
COMPACT_WIDTH = 44  # one line per node when the full cells would not all fit on screen
COMPACT_GUTTER = 1


def node_line(node: NodeSnapshot, ranks: Sequence[RankHealth]) -> Content:
    """A node on one line (compact mode): name, badge, per-GPU utilisation, mean, straggler score."""
    name = node.name if len(node.name) <= 12 else node.name[:11] + "…"
    state = node.state.value
    parts: list[str | Content] = [
        Content.styled(name.ljust(13), "bold"),
        f.badge(state).pad_right(11 - len(f.badge(state))),
    ]
    sample = node.sample
    if sample is not None and sample.gpu_ok and sample.gpus:
        utils = [g.util_pct for g in sample.gpus]
        known = [u for u in utils if u is not None]
        parts += [
            Content.styled(f.column_bar(utils), "$accent"),
            f" {f.pct(sum(known) / len(known)) if known else '-':>4}",
        ]
    elif sample is not None:
        parts += [Content.styled(f.hbar(sample.cpu_pct, 100, 8), "$accent"), f" {f.pct(sample.cpu_pct):>4}"]
    else:
        parts += [Content.styled("no sample".ljust(13), "dim")]
    scores = [r.score for r in ranks if r.score is not None]
    if scores:
        score = min(scores)
        parts.append(Content.styled(f" s{score:.2f}", f.health_style("straggler" if score < 0.8 else "ok")))
    return Content.assemble(*parts)


def node_lines(node: NodeSnapshot, ranks: Sequence[RankHealth]) -> list[Content]:
    """The four lines of a node's cell."""
    state = node.state.value
    name = node.name if len(node.name) <= 12 else node.name[:11] + "…"
    lines = [Content.assemble(Content.styled(name.ljust(13), "bold"), f.badge(state))]
    sample = node.sample
    scores = [r.score for r in ranks if r.score is not None]
    score = min(scores) if scores else None
    score_text = (
        Content.styled(f" s{score:.2f}", f.health_style("straggler" if score < 0.8 else "ok"))
        if score is not None
        else Content("")
    )
    if sample is not None and sample.gpu_ok and sample.gpus:
        gpus = sample.gpus
        utils = [g.util_pct for g in gpus]
        known = [u for u in utils if u is not None]
        mem = [
            (100 * g.mem_used_mb / g.mem_total_mb) if g.mem_used_mb is not None and g.mem_total_mb else None
            for g in gpus
        ]
        temps = [g.temp_c for g in gpus if g.temp_c is not None]
        power = sum(g.power_w for g in gpus if g.power_w is not None)
        bad = [g for g in gpus if g.error or g.throttle]
        lines.append(
            Content.assemble(
                Content.styled("util ", "dim"),
                Content.styled(f.column_bar(utils), "$accent"),
                f" {f.pct(sum(known) / len(known)) if known else '-':>4}",
                score_text,
            )
        )
        power_text = f"{power / 1000:.1f}kW" if power >= 1000 else f"{power:.0f}W"
        lines.append(
            Content.assemble(
                Content.styled("mem  ", "dim"),
                Content.styled(f.column_bar(mem), "$secondary"),
                f" {max(temps):.0f}°C" if temps else " -",
                f" {power_text}" if power else "",
            )
        )
        if bad:
            g = bad[0]
            why = g.error or ",".join(g.throttle)
            lines.append(Content.styled(f"gpu{g.index}: {why}", f.health_style("degraded")))
            return lines
    elif sample is not None:
        cpu = sample.cpu_pct
        lines.append(
            Content.assemble(
                Content.styled("cpu  ", "dim"),
                Content.styled(f.hbar(cpu, 100, 8), "$accent"),
                f" {f.pct(cpu):>4}",
                score_text,
            )
        )
        ram = (
            f" {sample.ram_used_gb:.1f}/{sample.ram_total_gb:.0f}G"
            if sample.ram_used_gb is not None and sample.ram_total_gb
            else ""
        )
        lines.append(
            Content.assemble(
                Content.styled("ram  ", "dim"),
                Content.styled(f.hbar(sample.ram_used_gb, sample.ram_total_gb, 8), "$secondary"),
                ram,
            )
        )
    else:
        why = "no agent sample yet" if node.agent in ("", "starting", "running") else node.agent
        lines.append(Content.styled(why[:28], "dim"))
        lines.append(score_text if score is not None else Content(""))
    if node.detail and state not in ("ok", "unknown"):
        lines.append(Content.styled(node.detail[:40], f.health_style(state)))
    else:
        ages = [r.heartbeat_age_s for r in ranks if r.heartbeat_age_s is not None]
        step_times = [r.step_time_s for r in ranks if r.step_time_s is not None]
        parts = [f.rank_span(node.ranks)]
        if step_times:
            parts.append(f"{max(step_times):.2f}s")
        if ages:
            parts.append(f"hb {f.age(max(ages))}")
        lines.append(Content.styled(" ".join(parts), "dim"))
    return lines


class NodeCell(Widget, can_focus=True):
    """One node. `node` is a NodeSnapshot, `ranks` its RankHealth values."""

    node: reactive[NodeSnapshot | None] = reactive(None, layout=False)
    ranks: reactive[tuple[RankHealth, ...]] = reactive((), layout=False)
    compact: reactive[bool] = reactive(False)

    def __init__(self, name: str) -> None:
        super().__init__(classes="node-cell")
        self.node_name = name
        self.tooltip = name

    def watch_node(self, node: NodeSnapshot | None) -> None:
        if node is None:
            return
        for s in ("ok", "degraded", "stalled", "failed", "lost", "unknown"):
            self.set_class(node.state.value == s, f"-{s}")

    def render(self) -> Content:
        if self.node is None:
            return Content(self.node_name)
        if self.compact:
            return node_line(self.node, self.ranks)
        return Content("\n").join(node_lines(self.node, self.ranks))


class NodeGrid(VerticalScroll, can_focus=False):
    """Cells for a ClusterState's nodes; `filter_text` keeps the cells whose name or state contains it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "open_node", "Open", id="drill-down", tooltip="Open the node under the cursor"),
        Binding("left", "move(-1, 0)", "Left", show=False, id="cursor-left"),
        Binding("right", "move(1, 0)", "Right", show=False, id="cursor-right"),
        Binding("up", "move(0, -1)", "Up", show=False, id="cursor-up"),
        Binding("down", "move(0, 1)", "Down", show=False, id="cursor-down"),
    ]

    class NodeChosen(Message):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    filter_text: reactive[str] = reactive("")

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cells: dict[str, NodeCell] = {}
        self._columns = 0
        self._compact = False
        self._rows_compact: bool | None = None

    def update_state(self, state: RunView) -> None:
        by_node: dict[str, list[RankHealth]] = {}
        for r in state.ranks:
            by_node.setdefault(r.node, []).append(r)
        names = [n.name for n in state.nodes]
        new = [NodeCell(n) for n in names if n not in self._cells]
        for cell in new:
            cell.compact = self._compact
        for cell in new:
            self._cells[cell.node_name] = cell
        gone = [name for name in self._cells if name not in names]
        for name in gone:
            self._cells.pop(name).remove()
        for n in state.nodes:
            cell = self._cells[n.name]
            cell.ranks = tuple(by_node.get(n.name, ()))
            cell.node = n
        if new:
            self.mount_all(new)
        self._apply_filter()
        self._layout_cells()

    def on_resize(self) -> None:
        self._layout_cells()

    def _layout_cells(self) -> None:
        """Full cells while they all fit on screen, else one line per node (64 nodes on one screen)."""
        width, height = self.size.width, self.size.height
        if not width or not height:
            return
        shown = sum(1 for c in self._cells.values() if c.display)
        full_cols = max(1, width // CELL_WIDTH)
        rows_needed = -(-shown // full_cols)
        rows_visible = max(1, height // CELL_HEIGHT)
        # full cells while they fit, or nearly (a row to scroll); else one line per node
        compact = rows_needed > max(rows_visible + 1, rows_visible * 1.25)
        cols = max(1, (width + COMPACT_GUTTER) // (COMPACT_WIDTH + COMPACT_GUTTER)) if compact else full_cols
        if compact != self._compact:
            self._compact = compact
            self.set_class(compact, "-compact")
            for c in self._cells.values():
                c.compact = compact
        if cols != self._columns or self._rows_compact is not compact:
            # style changes relayout the grid: only when the shape changes, not on every state
            self._columns = cols
            self._rows_compact = compact
            self.styles.grid_size_columns = cols
            self.styles.grid_rows = "1" if compact else str(CELL_HEIGHT)

    def on_mount(self) -> None:
        self.on_resize()

    def watch_filter_text(self, _text: str) -> None:
        self._apply_filter()

    def _apply_filter(self) -> None:
        text = self.filter_text.strip().lower()
        for name, cell in self._cells.items():
            node = cell.node
            hay = [name.lower()] + (
                [node.state.value, (node.detail or "").lower()] if node is not None else []
            )
            shown = not text or any(text in h for h in hay)
            if cell.display != shown:
                cell.display = shown
        self._layout_cells()

    def visible_cells(self) -> list[NodeCell]:
        return [c for c in self._cells.values() if c.display]

    def focus_first(self) -> None:
        cells = self.visible_cells()
        if cells and not any(c.has_focus for c in cells):
            cells[0].focus(scroll_visible=False)

    def action_move(self, dx: int, dy: int) -> None:
        cells = self.visible_cells()
        if not cells:
            return
        current = next((i for i, c in enumerate(cells) if c.has_focus), None)
        if current is None:
            cells[0].focus()
            return
        target = current + dx + dy * self._columns
        if 0 <= target < len(cells):
            cells[target].focus()

    def action_open_node(self) -> None:
        focused = next((c for c in self.visible_cells() if c.has_focus), None)
        if focused is not None:
            self.post_message(self.NodeChosen(focused.node_name))

    def on_click(self, event: events.Click) -> None:
        widget = event.widget
        if isinstance(widget, NodeCell):
            widget.focus()
