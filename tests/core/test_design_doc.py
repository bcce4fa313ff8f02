"""docs/design.md is the contract between the trainer and the console, so it must name every field the
console reads: each heartbeat field, each trainer event field (and each event kind, status and reason
value it compares against), each field of the node agent's lines. The fields are found by reading the
console's code (an AST scan of the modules that parse heartbeats, events and agent lines), not from a
hand-kept list, so a new read fails here until the doc names it.

Also: every docstring or comment in taehv_console/ and trainer/ that cites a design document cites
docs/design.md, and that file exists.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "design.md"

HEARTBEAT, EVENT, AGENT = "heartbeat", "event", "agent line"
# The doc's section that must name each kind of field (its "### " heading starts with this).
SECTIONS = {HEARTBEAT: "### Heartbeats", EVENT: "### Trainer events", AGENT: "### The per-node agent"}

# The modules that read heartbeats, trainer events or agent lines, and what each dict they read from
# holds, by the receiver's name: `hb.get("step")` -> "hb", `e.start.get(...)` -> "start",
# `(x or {}).get(...)` -> x's name, `max(...).get(...)` -> "call:max", `kv[1].get(...)` -> "sub:kv[1]".
# None: a dict that holds none of the three; the names below say what it holds instead. A
# string-keyed read from a receiver missing here fails the test: classify it, so that nothing the
# console reads escapes the check. Reads are found in string-keyed `.get()` calls and subscripts,
# and in `.get(key)` where `key` runs over a literal tuple in a loop of the same function.
RUN_TOML = LOG_SIGNAL = FORENSICS = OTHER = None  # run.toml; core/logscan.py's LogSignal; forensics reports
RECEIVERS: dict[str, dict[str, str | None]] = {
    "taehv_console/core/watch/ingest.py": {
        "hb": HEARTBEAT,  # RankTracker.update, Ingest.apply_heartbeats
        "start": EVENT,  # a rank's start event (RankEvents.start)
        "stop": EVENT,  # a rank's stop event (RankEvents.stop)
        "last_step": EVENT,  # rank 0's newest step event
        "run_cfg": RUN_TOML,
        "topo": RUN_TOML,
        "sched": RUN_TOML,
        "s": LOG_SIGNAL,
    },
    "taehv_console/core/watch/events.py": {
        "ev": EVENT,
        "e": EVENT,
        "prev": EVENT,  # the previous step event
        "call:max": EVENT,  # the newest complete checkpoint event
        "cache": EVENT,  # a compile event's cache
    },
    "taehv_console/core/watch/health.py": {"s": LOG_SIGNAL},
    "taehv_console/core/watch/state.py": {
        # ForensicsSummary.from_report reads a forensics report (core/forensics), not a trainer file
        "data": FORENSICS,
        "d": FORENSICS,
        "f": FORENSICS,
        "mine": FORENSICS,
        "ref": FORENSICS,
        "v": FORENSICS,
    },
    "taehv_console/core/watch/view.py": {
        "last": EVENT,  # rank 0's newest step event
        "last_val": EVENT,
        "start0": EVENT,  # rank 0's start event
        "stop": EVENT,
    },
    "taehv_console/core/watch/checkpoints.py": {"ev": EVENT},
    "taehv_console/core/watch/agent.py": {
        "beat": HEARTBEAT,  # RunProcesses finds its node's ranks by host and pid
        "out": OTHER,  # the line the agent is building (HostSampler.read)
        "info": OTHER,  # psutil's process info
        "call:psutil.Process(pid).environ": OTHER,  # a process's environment
    },
    "taehv_console/core/watch/nodeline.py": {
        # parse_sample and gpu_samples: the agent's own line and its raw NVML reading
        "data": AGENT,
        "reading": AGENT,
        "d": AGENT,
        "dev": AGENT,
        "p": AGENT,
        "util": AGENT,
        "mem": AGENT,
    },
    "taehv_console/core/run/progress.py": {"event": EVENT},
    "taehv_console/core/run/control.py": {
        "e": EVENT,  # stop events
        "request": OTHER,  # stop.request (its fields are named in the doc's stop.request section)
    },
    "taehv_console/core/run/failure.py": {
        "e": EVENT,  # error events
        "event": EVENT,
        "sub:kv[1]": EVENT,  # (rank, error event) pairs
        "sig": LOG_SIGNAL,
    },
    "taehv_console/follow.py": {
        "e": EVENT,  # trainer events in the controller's snapshot
        "p": OTHER,  # the controller's progress summary
        "summary": OTHER,
    },
}
# Fields the console reads through a name rather than a literal, e.g. RankHealth.metric("data_wait_s").
METRIC_METHOD = "metric"  # RankHealth.metric: a heartbeat number by name (core/watch/state.py)
# ingest.py's set of heartbeat keys that are not per-rank measurements: each is read or skipped by name.
HB_META = ("taehv_console/core/watch/ingest.py", "_HB_META")


def _receiver(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.BoolOp):
        return _receiver(node.values[0])
    if isinstance(node, ast.Call):
        return "call:" + ast.unparse(node.func)
    if isinstance(node, ast.Subscript):
        return "sub:" + ast.unparse(node)
    return type(node).__name__


def _str(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _strings(node: ast.AST) -> Iterator[str]:
    for n in ast.walk(node):
        s = _str(n)
        if s is not None:
            yield s


def _loop_keys(scope: ast.AST, name: str) -> set[str]:
    """String constants a loop variable `name` takes: `for series, key in ((x, "loss"), ...)`."""
    keys: set[str] = set()
    for node in ast.walk(scope):
        if isinstance(node, (ast.For, ast.comprehension)):
            targets = {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
            if name in targets:
                keys |= set(_strings(node.iter))
    return keys


def _scopes(tree: ast.Module) -> dict[ast.AST, ast.AST]:
    """node -> the function (or module) it is in."""
    out: dict[ast.AST, ast.AST] = {}

    def visit(node: ast.AST, scope: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else scope
            out[child] = inner
            visit(child, inner)

    visit(tree, tree)
    return out


class Reads:
    """What the console's code reads: fields and compared values per kind, and what it could not place."""

    def __init__(self) -> None:
        self.fields: dict[str, dict[str, set[str]]] = {HEARTBEAT: {}, EVENT: {}, AGENT: {}}
        self.values: dict[str, set[str]] = {}  # event values compared against -> where
        self.unclassified: set[str] = set()
        self.unresolved: set[str] = set()

    def field(self, kind: str, name: str, where: str) -> None:
        self.fields[kind].setdefault(name, set()).add(where)

    def scan(self, rel: str, receivers: dict[str, str | None]) -> None:
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"), rel)
        scopes = _scopes(tree)
        for node in ast.walk(tree):
            where = f"{rel}:{getattr(node, 'lineno', '?')}"
            key_node = recv_node = None
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                if node.func.attr == "get":
                    key_node, recv_node = node.args[0], node.func.value
            elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                key_node, recv_node = node.slice, node.value
            elif isinstance(node, ast.Compare):
                self._compare(node, receivers, scopes[node], where)
            if key_node is None or recv_node is None:
                continue
            recv = _receiver(recv_node)
            key = _str(key_node)
            holds = receivers.get(recv)
            if key is not None:
                if recv not in receivers:
                    self.unclassified.add(f"{where}: {recv!r} [{key!r}]")
                elif holds is not None:
                    self.field(holds, key, where)
            elif isinstance(key_node, ast.Name) and holds is not None:
                keys = _loop_keys(scopes[node], key_node.id)
                if not keys:
                    self.unresolved.add(f"{where}: {recv}.get({key_node.id})")
                for k in keys:
                    self.field(holds, k, where)

    @staticmethod
    def _event_field(node: ast.AST, receivers: dict[str, str | None]) -> str | None:
        """ "kind" for `ev.get("kind")` when `ev` holds an event, else None."""
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and receivers.get(_receiver(node.func.value)) == EVENT
        ):
            return _str(node.args[0])
        return None

    def _compare(
        self, node: ast.Compare, receivers: dict[str, str | None], scope: ast.AST, where: str
    ) -> None:
        """`ev.get("status") == "complete"`, or `kind == "step"` after `kind = ev.get("kind")` in the
        same function: the value compared is an event value the doc must name."""
        compared = self._event_field(node.left, receivers)
        if compared is None and isinstance(node.left, ast.Name):
            compared = self._alias(scope, node.left.id, receivers)
        if compared is None:
            return
        for right in node.comparators:
            literals = right.elts if isinstance(right, (ast.Tuple, ast.List, ast.Set)) else [right]
            for value in filter(None, map(_str, literals)):
                self.values.setdefault(value, set()).add(f"{where} ({compared})")

    def _alias(self, scope: ast.AST, name: str, receivers: dict[str, str | None]) -> str | None:
        """The event field a local name was assigned from in `scope` (`kind, rank = ev.get("kind"), ...`)."""
        for node in ast.walk(scope):
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            target, value = node.targets[0], node.value
            pairs = (
                list(zip(target.elts, value.elts))
                if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                else [(target, value)]
            )
            for t, v in pairs:
                if isinstance(t, ast.Name) and t.id == name:
                    found = self._event_field(v, receivers)
                    if found is not None:
                        return found
        return None


def console_reads() -> Reads:
    reads = Reads()
    for rel, receivers in RECEIVERS.items():
        reads.scan(rel, receivers)
    # RankHealth.metric("...") anywhere in the console (the UI included) names a heartbeat number
    for path in sorted((ROOT / "taehv_console").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                key = _str(node.args[0])
                if node.func.attr == METRIC_METHOD and key is not None:
                    reads.field(HEARTBEAT, key, f"{rel}:{node.lineno}")
    rel, name = HB_META
    meta = [
        n
        for n in ast.parse((ROOT / rel).read_text(encoding="utf-8"), rel).body
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)
    ]
    assert meta, f"{rel} no longer defines {name}: update HB_META in this test"
    for key in _strings(meta[0].value):
        reads.field(HEARTBEAT, key, f"{rel}:{meta[0].lineno} ({name})")
    return reads


def section(text: str, heading: str) -> str:
    """The doc's text from a heading to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
    assert start is not None, f"docs/design.md has no section {heading!r}"
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if lines[i].startswith("#") and len(lines[i].split(" ", 1)[0]) <= len(level)
        ),
        len(lines),
    )
    return "\n".join(lines[start:end])


def test_the_scan_finds_what_the_console_is_known_to_read():
    # a scanner that silently finds nothing would pass the check below: it must see these
    reads = console_reads()
    assert not reads.unclassified, (
        "string-keyed reads from dicts this test cannot place; add the receiver to RECEIVERS "
        "(HEARTBEAT, EVENT, AGENT, or None with a reason):\n" + "\n".join(sorted(reads.unclassified))
    )
    assert not reads.unresolved, "fields read through a variable this test cannot resolve:\n" + "\n".join(
        sorted(reads.unresolved)
    )
    hb, ev, agent = (set(reads.fields[k]) for k in (HEARTBEAT, EVENT, AGENT))
    assert {"step", "time", "pid", "host", "step_time_s", "wait_s", "stopped", "waiting_since"} <= hb
    assert {"data_wait_s", "waiting_op"} <= hb  # through RankHealth.metric and ingest's _HB_META
    assert {"kind", "time", "rank", "step", "loss", "psnr", "status", "reason", "message"} <= ev
    assert {"samples_per_s", "lr"} <= ev  # read through the loop in EventFold._step
    assert {"host", "time", "nvml", "devices", "processes", "owners"} <= agent
    assert {"step", "start", "stop", "error", "checkpoint", "val", "data"} <= set(reads.values)


def test_every_field_the_console_reads_is_named_in_the_design_doc():
    text = DOC.read_text(encoding="utf-8")
    reads = console_reads()
    missing = []
    for kind, heading in SECTIONS.items():
        body = section(text, heading)
        for name, where in sorted(reads.fields[kind].items()):
            if f"`{name}`" not in body:
                missing.append(f"{kind} field `{name}` (read at {', '.join(sorted(where))})")
    events = section(text, SECTIONS[EVENT])
    for value, where in sorted(reads.values.items()):
        if f"`{value}`" not in events:
            missing.append(f"event value `{value}` (compared at {', '.join(sorted(where))})")
    assert not missing, (
        "docs/design.md does not name these (in backticks, in the section on heartbeats, trainer "
        "events or the agent):\n" + "\n".join(missing)
    )


# A citation of a design document: DESIGN (the old name; in capitals only, since "by design" in prose
# is not one), any design.md, or a "design doc".
DESIGN_WORD = re.compile(r"\bDESIGN\b")
DESIGN_FILE = re.compile(r"design\.md|\bdesign doc", re.IGNORECASE)


def _cites_another(line: str) -> bool:
    """Whether a line cites a design document other than docs/design.md."""
    rest = line.replace("docs/design.md", "")
    return bool(DESIGN_WORD.search(rest) or DESIGN_FILE.search(rest))


def test_design_citations_in_the_code_point_to_docs_design_md():
    assert DOC.is_file(), "docs/design.md is missing"
    cited, wrong = 0, []
    for package in ("taehv_console", "trainer"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if "docs/design.md" in line:
                    cited += 1
                if _cites_another(line):
                    wrong.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not wrong, "these cite a design document other than docs/design.md:\n" + "\n".join(wrong)
    assert cited, "nothing in the code cites docs/design.md: is the scan looking at the right files?"
