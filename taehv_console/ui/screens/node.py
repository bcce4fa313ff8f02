"""Node drill-down: the node's GPUs (one row each), its ranks (step time, heartbeat age, straggler
score), its launcher log with follow and search, and larger loss / PSNR / utilisation charts
(textual-plotext). The log is read by a thread worker by byte offset; the rest comes from the
newest ClusterState."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import DataTable, Footer, Input, Log, Static, TabbedContent, TabPane
from textual.worker import get_current_worker
from textual_plotext import PlotextPlot

from taehv_console.core.watch.tail import Tailer
from taehv_console.ui import formatting as f
from taehv_console.ui.messages import LogChunk, LogRead
from taehv_console.ui.screens.base import ConsoleScreen
from taehv_console.ui.screens.dialogs import MessageScreen

if TYPE_CHECKING:
    from textual import getters

    from taehv_console.core.watch.state import NodeSnapshot, RankHealth, RunView
    from taehv_console.ui.apptype import ConsoleApp

GPU_COLUMNS = ("gpu", "util", "memory", "temp", "power", "state", "run mem")
# "data": the share of step time this rank waited for its next batch (loader too slow when high)
RANK_COLUMNS = ("rank", "state", "step", "heartbeat", "step time", "score", "busy", "data", "pid", "detail")
LOG_LINES = 5000


def node_header(node: NodeSnapshot, state: RunView) -> Content:
    parts: list[str | Content] = [Content.styled(node.name, "bold"), "  ", f.badge(node.state.value)]
    if node.detail:
        parts += ["  ", Content.styled(node.detail, f.health_style(node.state.value))]
    s = node.sample
    line2: list[str | Content] = [Content.styled("ranks ", "dim"), f.rank_span(node.ranks)]
    if s is not None:
        line2 += [
            Content.styled("  cpu ", "dim"),
            f.pct(s.cpu_pct),
            Content.styled(f" of {s.cpu_count}" if s.cpu_count else "", "dim"),
        ]
        if s.ram_total_gb:
            line2 += [Content.styled("  ram ", "dim"), f"{s.ram_used_gb or 0:.1f}/{s.ram_total_gb:.0f} GB"]
        if s.net_rx_mbps is not None:
            line2 += [Content.styled("  net ", "dim"), f"↓{s.net_rx_mbps:.0f} ↑{s.net_tx_mbps or 0:.0f} Mb/s"]
        for d in s.disks[:1]:
            line2 += [Content.styled("  disk ", "dim"), f"{d.free_gb:.0f} GB free"]
    line2 += [
        Content.styled("  agent ", "dim"),
        node.agent or "-",
        Content.styled("  sample ", "dim"),
        f.age(node.sample_age_s),
    ]
    if node.clock_offset_s is not None:
        line2 += [Content.styled("  clock ", "dim"), f"{node.clock_offset_s:+.2f}s"]
    return Content("\n").join([Content.assemble(*parts), Content.assemble(*line2)])


def stack_content(state: RunView, node_name: str) -> Content:
    """The stalled ranks of this node, each with its stack from the stall's forensics (py-spy, or
    the rank's own dump; innermost frame first) and what the tools said, as `status --json`
    carries them."""
    stalled = [r for r in state.stalled if r.node == node_name]
    if not stalled:
        return Content.styled(
            "no stalled rank on this node: a stall's stack shows here once forensics ran", "dim"
        )
    lines: list[Content] = []
    for r in stalled:
        lines.append(
            Content.styled(f"rank {r.rank} stalled (pid {r.pid}): {r.detail}", f.health_style("stalled"))
        )
        report = state.forensics_for(r.rank)
        if report is None:
            lines.append(Content.styled("  collecting its stack ...", "dim"))
            continue
        lines += [Content(f"  {frame}") for frame in report.frames] or [Content.styled("  no stack", "dim")]
        lines += [Content.styled(f"  note: {n}", "dim") for n in report.notes]
        if report.flight_recorder:
            lines.append(Content(f"  flight recorder: {report.flight_recorder}"))
        if report.ras:
            lines.append(Content(f"  NCCL RAS: {report.ras}"))
        if report.report:
            lines.append(Content.styled(f"  report: {report.report}", "dim"))
    return Content("\n").join(lines)


def gpu_rows(node: NodeSnapshot) -> list[tuple[str | Content, ...]]:
    s = node.sample
    if s is None:
        return [("-", "no agent sample yet", "", "", "", "", "")]
    if not s.gpu_ok:  # the reason in words that fit; i shows the whole of it
        return [("-", f"no GPU — {f.no_gpu_words(s.gpu_reason)}", "", "", "", "", "")]
    rows: list[tuple[str | Content, ...]] = []
    for g in s.gpus:
        mem = (
            f"{g.mem_used_mb / 1024:.1f}/{g.mem_total_mb / 1024:.0f}G"
            if g.mem_used_mb is not None and g.mem_total_mb
            else "-"
        )
        power = (
            f"{g.power_w:.0f}/{g.power_limit_w:.0f}W"
            if g.power_w is not None and g.power_limit_w
            else (f"{g.power_w:.0f}W" if g.power_w is not None else "-")
        )
        if g.error:
            st = f.badge("failed") + Content(f" {g.error}")
        elif g.throttle:
            st = f.badge("degraded") + Content(" " + ",".join(g.throttle))
        else:
            st = f.badge("ok")
        rows.append(
            (
                str(g.index),
                f"{f.column_bar([g.util_pct])} {f.pct(g.util_pct)}",
                mem,
                f"{g.temp_c:.0f}°C" if g.temp_c is not None else "-",
                power,
                st,
                f"{g.run_mem_mb / 1024:.1f}G",
            )
        )
    return rows


def rank_rows(ranks: list[RankHealth]) -> list[tuple[str | Content, ...]]:
    rows: list[tuple[str | Content, ...]] = []
    for r in ranks:
        detail = r.detail or (f"waiting for rank {r.blocked_by}" if r.blocked_by is not None else "")
        rows.append(
            (
                str(r.rank),
                f.badge(r.state.value),
                "-" if r.step is None else str(r.step),
                f.age(r.heartbeat_age_s),
                f"{r.step_time_s:.3f}s" if r.step_time_s is not None else "-",
                f"{r.score:.2f}" if r.score is not None else "-",
                f"{r.busy_s:.3f}s" if r.busy_s is not None else "-",
                f.pct(100 * r.data_wait_share) if r.data_wait_share is not None else "-",
                str(r.pid or "-"),
                detail[:60],
            )
        )
    return rows


class MetricPlot(PlotextPlot):
    """A line chart of one or more (x, y) series; redrawn only when its data changes."""

    def __init__(self, title: str, xlabel: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.title = title
        self.xlabel = xlabel
        self._data: tuple[Any, ...] | None = None

    def show(self, series: list[tuple[str, list[float], list[float]]]) -> None:
        key = tuple((name, tuple(xs[-1:]), len(xs)) for name, xs, _ in series)
        if key == self._data:
            return
        self._data = key
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        plt.xlabel(self.xlabel)
        for name, xs, ys in series:
            if xs:
                plt.plot(xs, ys, label=name if len(series) > 1 else None, marker="braille")
        self.refresh()


class NodeScreen(ConsoleScreen):
    if TYPE_CHECKING:
        app = getters.app(ConsoleApp)

    CSS_PATH = "node.tcss"
    # textual declares it "ClassVar[...] | None", which mypy reads as an instance variable
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-narrow"), (120, "-wide")]  # type: ignore[misc]
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back", id="back", tooltip="Back to the dashboard"),
        Binding("l", "show_tab('log')", "Log", id="show-log", tooltip="The node's launcher log", show=False),
        Binding("c", "show_tab('charts')", "Charts", id="show-charts", tooltip="Loss, PSNR, GPU utilisation"),
        Binding(
            "k", "show_tab('stack')", "Stack", id="show-stack", tooltip="A stalled rank's stack (forensics)"
        ),
        Binding("f", "toggle_follow", "Follow", id="follow-log", tooltip="Keep the log scrolled to its end"),
        Binding(
            "slash", "search_log", "Search", id="search-log", key_display="/", tooltip="Find text in the log"
        ),
        Binding("i", "gpu_reason", "Why no GPU", id="gpu-reason", tooltip="The whole reason it shows no GPU"),
        Binding(
            "n",
            "next_match",
            "Next match",
            id="next-match",
            tooltip="Next line matching the search",
            show=False,
        ),
    ]

    def __init__(self, node_name: str) -> None:
        super().__init__()
        self.node_name = node_name
        self._lines: list[str] = []
        self._search = ""
        self._match_at = -1
        self._follow = True
        self._no_gpu = False

    def compose(self) -> ComposeResult:
        yield Static("", id="node-header")
        with Horizontal(id="tables"):
            yield DataTable(id="gpus", cursor_type="none", zebra_stripes=True)
            yield DataTable(id="ranks", cursor_type="none", zebra_stripes=True)
        with TabbedContent(initial="log", id="node-tabs"):
            with TabPane("log", id="log"), Vertical():
                yield Input(
                    placeholder="search the log (enter: find, n: next, escape: back)", id="log-search"
                )
                yield Static("", id="log-status")
                yield Log(id="node-log", max_lines=LOG_LINES, auto_scroll=True)
            with TabPane("charts", id="charts"), Grid(id="chart-grid"):
                yield MetricPlot("loss", "step", id="loss-plot")
                yield MetricPlot("PSNR (dB)", "step", id="psnr-plot")
                yield MetricPlot("GPU utilisation (%)", "seconds ago", id="util-plot")
            with TabPane("stack", id="stack"), VerticalScroll():
                yield Static("", id="stack-text")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#gpus", DataTable).add_columns(*GPU_COLUMNS)
        self.query_one("#ranks", DataTable).add_columns(*RANK_COLUMNS)
        self.query_one("#gpus").border_title = "GPUs"
        self.query_one("#ranks").border_title = "ranks"
        self.query_one("#log-search").display = False
        self.watch(self.app, "cluster_state", self._show_state)
        self._update_log_status()
        session = self.app.session
        index = session.node_index(self.node_name) if session is not None else None
        if session is not None and index is not None:
            self._read_log(str(session.run.path), index)
        else:
            self.query_one("#log-status", Static).update(
                Content.styled("no log: this console does not control a run on this node", "dim")
            )

    def _show_state(self, state: RunView | None) -> None:
        if state is None or not self.is_current:
            return
        node = state.node(self.node_name)
        if node is None:
            self.query_one("#node-header", Static).update(f"{self.node_name}: not in the run's node list")
            return
        self.query_one("#node-header", Static).update(node_header(node, state))
        gpus = self.query_one("#gpus", DataTable)
        self._fill(gpus, gpu_rows(node))
        if (node.sample is not None and not node.sample.gpu_ok) != self._no_gpu:
            self._no_gpu = not self._no_gpu
            self.refresh_bindings()  # i (why no GPU) shows in the footer only then
        sample = node.sample
        names = sorted({g.name for g in sample.gpus}) if sample is not None and sample.gpu_ok else []
        gpus.border_title = (
            f"GPUs: {len(sample.gpus)}× {', '.join(names)}" if sample is not None and names else "GPUs"
        )
        ranks = [r for r in state.ranks if r.node == node.name]
        self._fill(self.query_one("#ranks", DataTable), rank_rows(ranks))
        self.query_one("#stack-text", Static).update(stack_content(state, node.name))
        if self.query_one(TabbedContent).active == "charts":
            self._plot(state)

    @staticmethod
    def _fill(table: DataTable, rows: list[tuple[str | Content, ...]]) -> None:
        table.clear()
        for row in rows:
            table.add_row(*f.table_row(row))

    def _plot(self, state: RunView) -> None:
        h = state.history
        for plot_id, series in (("#loss-plot", h.loss), ("#psnr-plot", h.psnr)):
            xs, ys = [p[0] for p in series.points], [p[1] for p in series.points]
            self.query_one(plot_id, MetricPlot).show([(series.name, xs, ys)])
        util = []
        for s in h.gpu_util:
            node, _, idx = s.name.rpartition("/")
            if node == self.node_name:
                util.append((f"gpu{idx}", [p[0] - state.time for p in s.points], [p[1] for p in s.points]))
        plot = self.query_one("#util-plot", MetricPlot)
        plot.title = "GPU utilisation (%)" if util else "GPU utilisation: no GPU on this node"
        plot.show(util)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "charts" and self.app.cluster_state is not None:
            self._plot(self.app.cluster_state)

    def on_screen_resume(self) -> None:
        self._show_state(self.app.cluster_state)

    # ---------------------------------------------------------------- log
    @work(thread=True, exclusive=True, group="node-log", exit_on_error=False)
    def _read_log(self, run_path: str, index: int) -> None:
        worker = get_current_worker()
        path = f"logs/node-{index}.log"
        tailer = Tailer(run_path, append=[path], max_bytes=1 << 20)
        while not worker.is_cancelled:
            res = tailer.poll()
            lines = tuple(b.decode(errors="replace") for b in res.lines.get(path, ()))
            if lines or path in res.reset:
                self.post_message(LogRead(LogChunk(index, lines[-LOG_LINES:], reset=path in res.reset)))
            if not res.more:
                for _ in range(10):  # 1 s between reads, leaving promptly when the screen closes
                    if worker.is_cancelled:
                        return
                    time.sleep(0.1)

    def on_log_read(self, message: LogRead) -> None:
        log = self.query_one("#node-log", Log)
        chunk = message.chunk
        if chunk.reset:
            log.clear()
            self._lines.clear()
        self._lines.extend(chunk.lines)
        del self._lines[:-LOG_LINES]
        log.write_lines(chunk.lines, scroll_end=self._follow)
        self._update_log_status()

    def action_toggle_follow(self) -> None:
        self._follow = not self._follow
        log = self.query_one("#node-log", Log)
        log.auto_scroll = self._follow
        if self._follow:
            log.scroll_end(animate=False)
        self._update_log_status()

    def _update_log_status(self) -> None:
        parts = [f"{len(self._lines)} line(s)", "following (f)" if self._follow else "paused (f follows)"]
        if self._search:
            hits = sum(1 for line in self._lines if self._search.lower() in line.lower())
            parts.append(f"“{self._search}”: {hits} match(es), n: next")
        self.query_one("#log-status", Static).update(Content.styled("  ·  ".join(parts), "dim"))

    def action_search_log(self) -> None:
        self.query_one(TabbedContent).active = "log"
        box = self.query_one("#log-search", Input)
        box.display = True
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "log-search":
            self._search = event.value.strip()
            self._match_at = len(self._lines)
            event.input.display = False
            self.query_one("#node-log", Log).focus()
            self.action_next_match()

    def action_next_match(self) -> None:
        """The previous matching line above the last one shown (newest first), scrolled into view."""
        if not self._search or not self._lines:
            return
        needle = self._search.lower()
        start = self._match_at if 0 <= self._match_at <= len(self._lines) else len(self._lines)
        order = list(range(start - 1, -1, -1)) + list(range(len(self._lines) - 1, start - 1, -1))
        for i in order:
            if needle in self._lines[i].lower():
                self._match_at = i
                log = self.query_one("#node-log", Log)
                if self._follow:
                    self.action_toggle_follow()
                log.scroll_to(y=max(0, i - 2), animate=False)
                self.query_one("#log-status", Static).update(
                    Content.assemble(
                        Content.styled(f"line {i + 1}: ", "dim"),
                        Content.styled(self._lines[i][:200], "$accent"),
                    )
                )
                return
        self.notify(f"“{self._search}” is not in the log", severity="warning")

    def _no_gpu_reason(self) -> str | None:
        """Why the node's agent found no GPU, or None when it did (or has not said yet)."""
        state = self.app.cluster_state
        node = state.node(self.node_name) if state is not None else None
        s = node.sample if node is not None else None
        return (s.gpu_reason or "none reported") if s is not None and not s.gpu_ok else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self._no_gpu_reason() is not None if action == "gpu_reason" else True  # i: only then

    def action_gpu_reason(self) -> None:
        reason = self._no_gpu_reason()
        if reason is not None:
            self.app.push_screen(MessageScreen(f"{self.node_name}: no GPU", reason, "info"))

    def action_show_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def action_back(self) -> None:
        box = self.query_one("#log-search", Input)
        if box.display:
            box.display = False
            self.query_one("#node-log", Log).focus()
            return
        self.app.pop_screen()
