"""Numbers and states as short text for narrow panes: durations, sizes, bars, health badges.
Pure functions of values; colours come from theme variables ($health-*), never literals."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.content import Content

from taehv_console.core.models import Finding
from taehv_console.core.watch.view import duration_text, number_text

# durations and numbers read the same in every front end (headless and status use these too)
duration = duration_text
num = number_text

BLOCKS = " ▁▂▃▄▅▆▇█"

# symbol + word: a state stays readable without colour (NO_COLOR, high contrast, colour blindness)
HEALTH_BADGES = {
    "ok": ("●", "ok"),
    "healthy": ("●", "healthy"),
    "starting": ("○", "starting"),
    "degraded": ("◐", "degraded"),
    "straggler": ("◐", "straggler"),
    "stalled": ("‖", "stalled"),
    "failed": ("✗", "failed"),
    "lost": ("?", "lost"),
    "stopped": ("■", "stopped"),
    "unknown": ("·", "unknown"),
    "running": ("▶", "running"),
    "done": ("✓", "done"),
    "waiting": ("…", "waiting"),
    "stopping": ("■", "stopping"),
    "recovering": ("↻", "recovering"),
    "launching": ("○", "launching"),
    "created": ("○", "created"),
    "complete": ("✓", "complete"),
    "incomplete": ("✗", "incomplete"),
    "in_progress": ("…", "writing"),
    "error": ("✗", "error"),
    "warning": ("!", "warning"),
    "info": ("·", "info"),
}
# rank and run states -> the theme's health colour variable
HEALTH_VARIABLE = {
    "ok": "ok",
    "healthy": "ok",
    "running": "ok",
    "done": "ok",
    "complete": "ok",
    "starting": "unknown",
    "waiting": "unknown",
    "unknown": "unknown",
    "stopped": "unknown",
    "created": "unknown",
    "launching": "unknown",
    "degraded": "degraded",
    "straggler": "degraded",
    "stopping": "degraded",
    "recovering": "degraded",
    "in_progress": "degraded",
    "warning": "degraded",
    "stalled": "stalled",
    "failed": "failed",
    "error": "failed",
    "incomplete": "failed",
    "lost": "lost",
    "info": "unknown",
}


def health_style(state: str) -> str:
    return f"$health-{HEALTH_VARIABLE.get(state, 'unknown')}"


def badge(state: str) -> Content:
    symbol, word = HEALTH_BADGES.get(state, ("·", state))
    return Content.styled(f"{symbol} {word}", f"bold {health_style(state)}")


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f}s" if seconds < 10 else duration(seconds)


def size(nbytes: float | None) -> str:
    if nbytes is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(nbytes) < 1000 or unit == "TB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    return "-"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def column_bar(values: Sequence[float | None], scale: float = 100.0) -> str:
    """One character per value, its height the value: eight GPUs' utilisation in eight cells."""
    out = []
    for v in values:
        if v is None:
            out.append("·")
            continue
        frac = min(1.0, max(0.0, v / scale))
        out.append(BLOCKS[min(8, max(1 if v > 0 else 0, round(frac * 8)))])
    return "".join(out)


def progress_bar(value: float | None, total: float | None, width: int = 12) -> Content:
    """A filled bar on a dim track."""
    filled = hbar(value, total, width).rstrip()
    return Content.assemble(
        Content.styled(filled, "$accent"), Content.styled("─" * (width - len(filled)), "dim")
    )


def hbar(value: float | None, total: float | None, width: int = 10) -> str:
    """A horizontal bar of `width` cells, eighths of a cell resolved."""
    if value is None or not total:
        return "·" * width
    frac = min(1.0, max(0.0, value / total))
    eighths = round(frac * width * 8)
    full, rest = divmod(eighths, 8)
    partial = "▏▎▍▌▋▊▉"[rest - 1] if rest else ""
    return ("█" * full + partial).ljust(width, " ")[:width]


def rank_span(ranks: Sequence[int]) -> str:
    """r0-7, r3, r0,2,5: the ranks a node holds, short."""
    if not ranks:
        return "r-"
    rs = sorted(ranks)
    if rs == list(range(rs[0], rs[-1] + 1)):
        return f"r{rs[0]}" if len(rs) == 1 else f"r{rs[0]}-{rs[-1]}"
    text = "r" + ",".join(map(str, rs))
    return text if len(text) <= 10 else f"r{rs[0]}…{rs[-1]}"


# why a node shows no GPU, in the few words a table cell holds; the whole reason is one key away
# (i on Detect and on the node screen)
_NO_GPU_WORDS = (
    ("nvidia-ml-py is not installed", "no nvidia-ml-py"),
    ("NVML unavailable", "no NVML"),
    ("NVML query failed", "NVML failed"),
    ("NVML found no GPU", "none found"),
    ("CUDA_VISIBLE_DEVICES", "all hidden"),
)


def no_gpu_words(reason: str, width: int = 16) -> str:
    """'NVML unavailable: NVML Shared Library Not Found' -> 'no NVML': whole words, never cut."""
    reason = reason.strip()
    if not reason:
        return "none visible"
    for prefix, words in _NO_GPU_WORDS:
        if reason.startswith(prefix):
            return words
    head = reason.split(":")[0].split("(")[0].strip()
    if len(head) <= width:
        return head
    cut = head[: width - 1].rsplit(" ", 1)[0]
    return cut + "…"


def table_cell(value: object) -> object:
    """A DataTable cell: plain strings stay plain (DataTable would read '[rank41]' as markup) and
    Content becomes rich Text with the theme's colours resolved (Text is measured for width)."""
    if isinstance(value, str):
        return Text(value, no_wrap=True)
    if isinstance(value, Content):
        # a segment without a style adds no span either way ("" or None)
        return Text.assemble(*((seg.text, seg.style or "") for seg in value.render_segments()), no_wrap=True)
    return value


def table_row(values: Sequence[object]) -> list[object]:
    return [table_cell(v) for v in values]


SEVERITY_TITLES = (
    ("error", "Errors: a launch is refused until they are fixed"),
    ("warning", "Warnings: the run may start, but read them"),
    ("info", "Information"),
)


def findings_content(findings: Sequence[Finding]) -> Content:
    """Preflight findings grouped by severity, each with its node, id and fix."""
    blocks: list[Content] = []
    for severity, title in SEVERITY_TITLES:
        group = [x for x in findings if x.severity.value == severity]
        if not group:
            continue
        lines = [Content.assemble(badge(severity), Content.styled(f" {len(group)} — {title}", "bold"))]
        for x in group:
            where = Content.styled(f"{x.node} ", "bold") if x.node else Content("")
            message = x.message.removeprefix(f"{x.node}: ") if x.node else x.message
            lines.append(Content.assemble("  ", where, Content.styled(f"({x.id}) ", "dim"), message))
            if x.fix:
                lines.append(Content.assemble(Content.styled("      fix: ", "$accent"), x.fix))
        blocks.append(Content("\n").join(lines))
    if not blocks:
        return Content.assemble(badge("ok"), " nothing to report")
    return Content("\n\n").join(blocks)
