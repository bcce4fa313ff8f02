"""Damaged per-rank records are read, never trusted (issue 44): an event line, a heartbeat, a
checkpoint manifest (and the small files beside them: the lock's holder, supervisor.json) that is
truncated, binary, an array or a field of the wrong type is checked where it is read, skipped and
named by file (and line), and everything around it is read on. Real files in a copy of a finished
run, read by the real readers and through the CLI's own commands: no traceback, the documented exit
code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from taehv_console.cli import main
from taehv_console.core.run import supervision
from taehv_console.core.run.lock import read_holder
from taehv_console.core.run.progress import AttemptEvents, EventTail
from taehv_console.core.run.records import DamagedRecord, parse_event, parse_heartbeat
from taehv_console.core.run.rundir import RunDir
from taehv_console.core.watch.agent import RunProcesses
from taehv_console.core.watch.checkpoints import CheckpointWatcher, RunActivity
from taehv_console.core.watch.ingest import Ingest
from taehv_console.core.watch.monitor import snapshot_once
from taehv_console.core.watch.samples import SamplesError, load_sample_step, newest_samples
from taehv_console.core.watch.tail import TailResult
from trainer import checkpoint as ckpt

pytestmark = pytest.mark.timeout(300)

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "cpu-smoke-done"

# name -> (a damaged event line, words its note must hold)
BAD_LINES: dict[str, tuple[bytes, str]] = {
    "truncated": (b'{"kind":"step","step":5,"lo', "not JSON"),
    "binary": (bytes(range(1, 10)) + bytes(range(128, 256)), "not text"),
    "array": (b"[1,2,3]", "a JSON array where an event"),
    "string": (b'"stop"', "a JSON string where an event"),
    "kind-a-list": (b'{"kind":[1],"rank":0}', "field kind"),
    "step-a-string": (b'{"kind":"step","rank":0,"step":"x","loss":0.1}', "field step"),
    "step-a-bool": (b'{"kind":"step","rank":0,"step":true}', "field step"),
    "stop-rank-a-string": (b'{"kind":"stop","rank":"0","step":3,"reason":"done"}', "field rank"),
    "time-infinite": (b'{"kind":"stop","rank":0,"step":3,"time":1e400}', "field time"),
    "start-world-size-a-string": (
        b'{"kind":"start","rank":0,"world_size":"two","step":0}',
        "field world_size",
    ),
    "skipped-checkpoints-a-number": (
        b'{"kind":"start","rank":0,"skipped_checkpoints":5}',
        "skipped_checkpoints",
    ),
    "checkpoint-step-a-list": (
        b'{"kind":"checkpoint","rank":0,"step":[5],"status":"complete"}',
        "field step",
    ),
    "val-psnr-a-string": (b'{"kind":"val","rank":0,"step":2,"psnr":"high"}', "field psnr"),
    "compile-cache-a-list": (b'{"kind":"compile","rank":0,"cache":[1]}', "field cache"),
    "integer-too-long": (b'{"kind":"step","rank":0,"step":' + b"9" * 5000 + b"}", "not JSON"),
    "nested-deep": (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
}

# name -> (a damaged heartbeat file, words its note must hold)
BAD_BEATS: dict[str, tuple[bytes, str]] = {
    "truncated": (b'{"rank":0,"step":', "not JSON"),
    "binary": (bytes(range(128, 256)), "not text"),
    "empty": (b"", "empty"),
    "array": (b"[1]", "a JSON array where a heartbeat"),
    "null": (b"null", "a JSON null where a heartbeat"),
    "step-a-string": (b'{"step":"x","time":1795413514.0,"pid":8324,"host":"h"}', "field step"),
    "time-a-list": (b'{"step":3,"time":[1],"pid":8324}', "field time"),
    "pid-a-string": (b'{"step":3,"time":1795413514.0,"pid":"p"}', "field pid"),
    "host-a-number": (b'{"step":3,"time":1795413514.0,"host":5}', "field host"),
}

# name -> (a damaged manifest.json, words the checkpoint's problem must hold)
BAD_MANIFESTS: dict[str, tuple[bytes, str]] = {
    "truncated": (b'{"step":5,"files":', "manifest unreadable"),
    "binary": (bytes(range(128, 256)), "manifest unreadable"),
    "array": (b"[1]", "manifest.json damaged: a JSON array"),
    "null": (b"null", "manifest.json damaged: a JSON null"),
    "files-a-list": (b'{"step":5,"files":[1,2]}', "field files"),
    "file-size-a-string": (b'{"step":5,"files":{"a.pt":"big"}}', "field files"),
    "hashes-a-list": (b'{"step":5,"files":{},"hashes":[1]}', "field hashes"),
    "step-a-string": (b'{"step":"five","files":{}}', "field step"),
    "bytes-a-string": (b'{"step":5,"files":{},"bytes":"x"}', "field bytes"),
    "nested-deep": (b"[" * 100000 + b"]" * 100000, "manifest unreadable"),
}


@pytest.fixture
def run(tmp_path) -> RunDir:
    dst = tmp_path / "runs" / "20261123-055714-cpu-smoke"
    shutil.copytree(FIXTURE, dst)
    return RunDir(dst)


def _damage_events(run: RunDir, line: bytes) -> tuple[int, list[dict]]:
    """The damaged line inserted after rank 0's third line; (its line number, the good events)."""
    path = run.event_file(0)
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:3]) + line + b"\n" + b"".join(lines[3:]))
    return 4, [json.loads(ln) for ln in lines if ln.strip()]


def _damage_manifest(run: RunDir, content: bytes) -> Path:
    step = run.checkpoints / "step-3"
    step.mkdir(parents=True)
    (step / ckpt.MANIFEST).write_bytes(content)
    (step / ckpt.COMPLETE).write_text("3\n")
    ckpt.write_latest(run.checkpoints, "step-3")
    return step


# ----------------------------------------------------------------------------- the checks themselves


@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_a_damaged_event_line_says_why(name):
    line, words = BAD_LINES[name]
    with pytest.raises(DamagedRecord, match=words):
        parse_event(line)


@pytest.mark.parametrize("name", sorted(BAD_BEATS))
def test_a_damaged_heartbeat_says_why(name):
    data, words = BAD_BEATS[name]
    with pytest.raises(DamagedRecord, match=words):
        parse_heartbeat(data)


def test_the_trainers_own_records_pass_as_they_are():
    for raw in FIXTURE.joinpath("events", "rank-0.jsonl").read_bytes().splitlines():
        assert parse_event(raw) == json.loads(raw)  # the very dict, nothing coerced
    # unknown kinds and fields are the readers' to ignore; a non-finite metric is written as null
    new = b'{"v":2,"kind":"teleport","rank":0,"time":1.0,"where":"mars","loss":null}'
    assert parse_event(new)["where"] == "mars"
    for path in FIXTURE.joinpath("heartbeat").iterdir():
        assert parse_heartbeat(path.read_bytes()) == json.loads(path.read_bytes())


# ----------------------------------------------------------------------------- the readers


@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_the_controller_reads_past_a_damaged_event_line_and_names_it(run, name):
    """core/run/progress.py, what the controller's and the supervisor's verdicts are made of."""
    at, good = _damage_events(run, BAD_LINES[name][0])
    notes: list[str] = []
    events = AttemptEvents(run.events, world_size=2, max_steps=3, note=notes.append)
    read = events.poll()
    assert [e for e in read if e["rank"] == 0] == good
    assert events.progress.step == 3 and set(events.progress.stops) == {0, 1}
    (note,) = notes
    assert note.startswith(f"{run.event_file(0)} line {at}: damaged, skipped: ")
    assert BAD_LINES[name][1] in note and events.damaged() == notes
    # read again from where it stopped: nothing twice
    assert events.poll() == [] and len(notes) == 1


def test_a_damaged_line_at_a_later_offset_is_numbered_from_the_files_start(run):
    path = run.event_file(0)
    size = path.stat().st_size
    n = len(path.read_bytes().splitlines())
    with open(path, "ab") as f:
        f.write(b'{"kind":"step","rank":0,"step":"x"}\n{"kind":"step","rank":0,"step":4}\n')
    tail = EventTail(path, size)  # a new attempt reads from its recorded offset
    assert [e["step"] for e in tail.read()] == [4]
    (note,) = tail.damaged
    assert note.startswith(f"{path} line {n + 1}: damaged, skipped: field step: ")


@pytest.mark.parametrize("name", sorted(BAD_LINES))
def test_the_dashboard_reads_past_a_damaged_event_line_and_names_it(run, name):
    """core/watch (events.py through the Monitor): the view every front end shows."""
    at, _good = _damage_events(run, BAD_LINES[name][0])
    view = snapshot_once(run.path)
    assert view.run.step == 3 and view.run.phase == "done"
    (damaged,) = view.damaged
    assert damaged.startswith(f"events/rank-0.jsonl line {at}: damaged, skipped: ")
    assert BAD_LINES[name][1] in damaged
    assert any(n.text == damaged and n.severity == "warning" for n in view.notices)


@pytest.mark.parametrize("name", sorted(BAD_BEATS))
def test_a_damaged_heartbeat_is_named_and_the_other_ranks_are_read(run, name):
    (run.heartbeats / "rank-0.json").write_bytes(BAD_BEATS[name][0])
    view = snapshot_once(run.path)
    (damaged,) = view.damaged
    assert damaged.startswith("heartbeat/rank-0.json: damaged, skipped: ") and BAD_BEATS[name][1] in damaged
    beat1 = json.loads((run.heartbeats / "rank-1.json").read_text())
    (r1,) = [r for r in view.ranks if r.rank == 1]
    assert r1.step == beat1["step"] and r1.pid == beat1["pid"]
    # the node agent (which finds the run's pids from the heartbeats) passes over it too
    procs = RunProcesses(str(run.path), hostname=str(beat1.get("host")))
    assert procs._read([run.heartbeats / "rank-0.json", run.heartbeats / "rank-1.json"])[0] == {
        beat1["pid"]: 1
    }


def test_a_heartbeat_repaired_is_no_longer_named(run):
    """One Ingest across polls, as a following console holds it: named once while damaged, and
    no longer once the rank writes a whole beat again."""
    ing = _ingest()
    good = (run.heartbeats / "rank-0.json").read_bytes()
    for _ in range(3):  # the same damage read again is one notice, not three
        ing.apply_heartbeats(TailResult(whole={"heartbeat/rank-0.json": b"[1]"}), now=1.0)
    assert ing.damaged() == (
        "heartbeat/rank-0.json: damaged, skipped: a JSON array where a heartbeat (an object) belongs",
    )
    assert [n.source for n in ing.notices] == ["damaged"] and 0 not in ing.ranks
    ing.apply_heartbeats(TailResult(whole={"heartbeat/rank-0.json": good}), now=2.0)
    assert ing.damaged() == () and ing.ranks[0].step == json.loads(good)["step"]


def _ingest() -> Ingest:
    return Ingest(
        ["localhost"],
        local_mode=True,
        rank_nodes=None,
        history_len=10,
        notices_len=10,
        signals_len=10,
        gpu_history_len=10,
        agent_restart_s=1.0,
        rank_window=10,
    )


@pytest.mark.parametrize(
    "content",
    [b"[1]", b"{", bytes(range(128, 256)), b"[" * 100000 + b"]" * 100000],
    ids=["array", "truncated", "binary", "nested-deep"],
)
def test_a_damaged_forensics_report_is_named_and_the_run_still_shown(run, content):
    (run.path / "forensics").mkdir()
    (run.path / "forensics" / "report-1.json").write_bytes(content)
    view = snapshot_once(run.path)
    (damaged,) = view.damaged
    assert damaged.startswith("forensics/report-1.json: damaged, skipped: not a forensics report (")
    assert view.forensics == () and view.run.phase == "done" and view.run.step == 3


def test_agent_lines_of_another_shape_are_counted_not_fatal():
    """The node agent's lines (over SSH) go through the same reader: a field of the wrong shape
    is one bad line, the good line after it still makes the node's sample."""
    ing = _ingest()
    agent = ing.agents["localhost"]
    good = {"host": "localhost", "time": 5.0, "cpu_pct": 12.5}
    bad = [
        {"host": "h", "time": 1, "owners": [1]},
        {"host": "h", "time": 1, "nvml": [1]},
        {"host": "h", "time": 1, "processes": [1]},
        {"host": "h", "time": "x"},
        {"host": "h", "time": 1, "disks": [{"path": 1}]},
        {"host": "h", "time": 1, "xid": {"events": 5}},
    ]
    lines = [json.dumps(d) for d in bad] + ["{" + "[" * 100000, json.dumps(good)]
    ing.apply_agent_lines(agent, lines, now=5.0)
    assert agent.bad_lines == len(bad) + 1
    assert agent.sample is not None and agent.sample.cpu_pct == 12.5


@pytest.mark.parametrize("name", sorted(BAD_MANIFESTS))
def test_a_damaged_manifest_makes_its_checkpoint_incomplete_with_why(run, name):
    content, words = BAD_MANIFESTS[name]
    step = _damage_manifest(run, content)
    st = ckpt.verify(step)
    assert st.state == "incomplete" and any(words in p for p in st.problems), st.problems
    assert ckpt.scan(run.checkpoints).newest is None
    summary = CheckpointWatcher(run.checkpoints).summary(RunActivity(live=False))
    (item,) = summary.items
    assert item.state.value == "incomplete" and any(words in p for p in item.problems)
    assert any("latest names step-3, which is incomplete" in p for p in summary.problems)


def test_damaged_lock_and_supervisor_files_name_nobody(run):
    for content in (b"[1]", bytes(range(128, 256)), b"{", b"null", b"[" * 100000 + b"]" * 100000):
        run.lock_path.write_bytes(content)
        assert read_holder(run.lock_path) == {}
        supervision.info_path(run).write_bytes(content)
        assert supervision.running_supervisor(run) is None


# ----------------------------------------------------------------------------- through the CLI

COMMANDS = {
    "status": lambda r: ["status", str(r)],
    "status --json": lambda r: ["status", str(r), "--json"],
    "attach": lambda r: ["attach", str(r)],
    "--no-tui": lambda r: ["--no-tui", "--run", str(r)],
}


def _damage_everything(run: RunDir) -> None:
    _damage_events(run, BAD_LINES["step-a-string"][0])
    with open(run.event_file(1), "ab") as f:
        f.write(BAD_LINES["binary"][0] + b"\n")
    (run.heartbeats / "rank-0.json").write_bytes(BAD_BEATS["array"][0])
    _damage_manifest(run, BAD_MANIFESTS["files-a-list"][0])
    run.node_status_path(0).parent.mkdir(exist_ok=True)
    run.node_status_path(0).write_bytes(b"[1]")
    run.lock_path.write_bytes(bytes(range(128, 256)))
    supervision.info_path(run).write_bytes(b'"x"')


def test_every_run_command_reads_past_damaged_records(run, capsys):
    _damage_everything(run)
    before = {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file()}
    for command, argv in COMMANDS.items():
        code = main(argv(run.path))  # an uncaught exception fails the test right here
        out = capsys.readouterr()
        text = out.out + out.err
        assert code == 0, f"{command}: exit {code} (the run is done: 0, as its --help says)\n{text}"
        assert "Traceback" not in text and "unexpected error" not in text, f"{command}\n{text}"
        if command == "status --json":
            info = json.loads(out.out)
            assert info["phase"] == "done" and info["progress"]["step"] == 3
            damaged = info["progress"]["damaged"]
            assert any(
                d.startswith("events/rank-0.jsonl line 4: damaged, skipped: field step") for d in damaged
            )
            assert any(d.startswith("events/rank-1.jsonl line ") and "not text" in d for d in damaged)
            assert any(d.startswith("heartbeat/rank-0.json: damaged, skipped: a JSON array") for d in damaged)
            assert info["checkpoint"] is None  # the damaged manifest's checkpoint is not offered
        if command == "status":  # the text names them too, not only --json
            assert "damaged: events/rank-0.jsonl line 4: damaged, skipped: field step" in out.out, out.out
    # nothing damaged was rewritten (the lock file is the lock: attach holds it, and empties it after)
    after = {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file() and p in before}
    assert {p: b for p, b in after.items() if p != run.lock_path} == {
        p: b for p, b in before.items() if p != run.lock_path
    }


def test_status_verify_says_which_manifest_is_damaged(run, capsys):
    _damage_manifest(run, BAD_MANIFESTS["array"][0])
    code = main(["status", str(run.path), "--verify"])
    out = capsys.readouterr()
    assert (
        code == 1 and "Traceback" not in out.out + out.err
    )  # status --help: 1, a checkpoint does not verify
    assert "step-3: INCOMPLETE: manifest.json damaged: a JSON array where an object belongs" in out.err


def test_the_installed_command_prints_no_traceback(run):
    """As a user types it, in a real process."""
    _damage_everything(run)
    exe = os.path.join(os.path.dirname(sys.executable), "taehv-console")
    out = subprocess.run([exe, "status", str(run.path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "Traceback" not in out.stdout + out.stderr, out.stderr
    assert "done" in out.stdout


@pytest.mark.parametrize("command", ["stop", "attach"])
def test_a_run_left_running_is_reconciled_past_its_damaged_lines(run, capsys, command):
    """The controller (stop, attach: a console that died left the run 'running') reads the
    attempt's events and the nodes' status files to reach its verdict: the damaged lines and files
    are said by file (and line), and the verdict is the run's own (done), not a crash."""
    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid nothing holds now: the launcher is gone
    data = json.loads(run.state_path.read_text())
    data["phase"] = "running"
    data["attempts"][0].update(ended=None, outcome=None)
    data["attempts"][0]["nodes"][0].update(pid=gone.pid, pgid=gone.pid)
    run.state_path.write_text(json.dumps(data))
    at, _good = _damage_events(run, BAD_LINES["step-a-string"][0])
    run.node_status_path(0).parent.mkdir(exist_ok=True)
    run.node_status_path(0).write_bytes(b"[1]")  # the wrapper's word on its exit: damaged
    argv = [command, str(run.path)] + (["--grace", "1"] if command == "stop" else [])
    code = main(argv)
    out = capsys.readouterr()
    text = out.out + out.err
    assert code == 0 and "Traceback" not in text, text
    assert (
        f"{run.event_file(0)} line {at}: damaged, skipped: field step: Input should be a valid integer"
        in text
    )
    status = f"{run.node_status_path(0)}: damaged, skipped: a JSON array where a status (an object) belongs"
    assert text.count(status) == 1, text  # said once, however often the controller looks
    assert run.read_state().phase.value == "done"


@pytest.mark.parametrize(
    "content",
    [b"[" * 100000 + b"]" * 100000, b'{"step":' + b"9" * 5000 + b"}", bytes(range(128, 256)), b"[1]"],
    ids=["nested-deep", "integer-too-long", "binary", "array"],
)
def test_a_damaged_samples_index_is_passed_over(run, capsys, content):
    (run.path / "samples" / "step-2").mkdir(parents=True)
    (run.path / "samples" / "step-2" / "index.json").write_bytes(content)
    with pytest.raises(SamplesError, match="index.json"):
        load_sample_step(run.path, 2)
    assert newest_samples(run.path) is None
    assert main(["status", str(run.path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["samples"] is None
