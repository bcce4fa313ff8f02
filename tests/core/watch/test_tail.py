"""Following files by byte offset: nothing is read twice, partial lines wait, late files are found,
replaced/truncated files start over, atomically replaced files are read whole; the SSH path (the
same reader run as a helper on the node) gives the same results."""

from __future__ import annotations

import json
import os

import pytest

from taehv_console.core.cluster.nodecall import NodeCallError
from taehv_console.core.cluster.ssh import LocalRunner
from taehv_console.core.watch.tail import LocalFiles, RemoteFiles, Tailer, read_chunks


class CountingFiles(LocalFiles):
    """Local reads, recording how many bytes each poll read (to prove nothing is read twice)."""

    def __init__(self):
        self.bytes_read = 0

    def read(self, root, append, whole, known, max_bytes):
        chunks = super().read(root, append, whole, known, max_bytes)
        self.bytes_read += sum(len(c.data) for c in chunks)
        return chunks


def test_new_lines_only_and_nothing_read_twice(tmp_path):
    (tmp_path / "events").mkdir()
    f = tmp_path / "events" / "rank-0.jsonl"
    f.write_bytes(b'{"a": 1}\n{"a": 2}\n')
    src = CountingFiles()
    t = Tailer(tmp_path, src, append=["events/rank-*.jsonl"])
    assert t.poll().lines == {"events/rank-0.jsonl": [b'{"a": 1}', b'{"a": 2}']}
    assert t.poll().lines == {}
    with open(f, "ab") as fh:
        fh.write(b'{"a": 3}\n')
    assert t.poll().lines == {"events/rank-0.jsonl": [b'{"a": 3}']}
    assert src.bytes_read == f.stat().st_size  # every byte read exactly once
    assert t.offset("events/rank-0.jsonl") == f.stat().st_size


def test_partial_last_line_waits_for_its_end(tmp_path):
    f = tmp_path / "node-0.log"
    f.write_bytes(b"first\nsec")
    t = Tailer(tmp_path, append=["*.log"])
    assert t.poll().lines == {"node-0.log": [b"first"]}
    with open(f, "ab") as fh:
        fh.write(b"ond half")
    assert t.poll().lines == {}  # still no newline
    with open(f, "ab") as fh:
        fh.write(b"\nthird\n")
    assert t.poll().lines == {"node-0.log": [b"second half", b"third"]}


def test_a_file_and_its_directory_that_appear_later_are_picked_up(tmp_path):
    t = Tailer(tmp_path, append=["events/rank-*.jsonl"])
    assert t.poll().lines == {}  # no events/ yet: not an error
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "rank-1.jsonl").write_bytes(b"x\n")
    (tmp_path / "events" / "notes.txt").write_bytes(b"not ours\n")
    assert t.poll().lines == {"events/rank-1.jsonl": [b"x"]}


def test_truncated_or_replaced_file_starts_over_and_says_so(tmp_path):
    f = tmp_path / "a.log"
    f.write_bytes(b"one\ntwo\n")
    t = Tailer(tmp_path, append=["*.log"])
    t.poll()
    f.write_bytes(b"new\n")  # truncated and rewritten (same inode)
    res = t.poll()
    assert res.lines == {"a.log": [b"new"]} and res.reset == {"a.log"}
    tmp = tmp_path / "a.log.tmp"
    tmp.write_bytes(b"replaced\nfile\n")
    os.replace(tmp, f)  # a new inode under the same name
    res = t.poll()
    assert res.lines == {"a.log": [b"replaced", b"file"]} and res.reset == {"a.log"}


def test_whole_files_are_read_when_replaced_and_not_otherwise(tmp_path):
    hb = tmp_path / "heartbeat"
    hb.mkdir()
    from trainer.events import atomic_write_text

    atomic_write_text(hb / "rank-0.json", json.dumps({"step": 1}))
    t = Tailer(tmp_path, whole=["heartbeat/rank-*.json"])
    assert json.loads(t.poll().whole["heartbeat/rank-0.json"]) == {"step": 1}
    assert t.poll().whole == {}
    atomic_write_text(hb / "rank-0.json", json.dumps({"step": 2}))
    assert json.loads(t.poll().whole["heartbeat/rank-0.json"]) == {"step": 2}


def test_a_large_backlog_is_read_in_bounded_pieces(tmp_path):
    f = tmp_path / "big.log"
    f.write_bytes(b"".join(b"line %06d\n" % i for i in range(10_000)))
    t = Tailer(tmp_path, append=["*.log"], max_bytes=4096)
    got, polls = [], 0
    while True:
        res = t.poll()
        polls += 1
        got += res.lines.get("big.log", [])
        if not res.more:
            break
    assert got == [b"line %06d" % i for i in range(10_000)]
    assert polls == -(-f.stat().st_size // 4096)


def test_remote_helper_gives_the_same_chunks_through_a_runner(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "node-0.log").write_bytes(b"\xff\xfebinary-ish\nok\npart")  # bytes survive the trip
    (tmp_path / "state.json").write_text("{}")
    known = {}
    local = read_chunks(tmp_path, ["logs/*.log"], ["state.json"], known)
    remote = RemoteFiles(LocalRunner("localhost")).read(
        str(tmp_path), ["logs/*.log"], ["state.json"], known, 1 << 20
    )
    assert sorted(local, key=lambda c: c.path) == sorted(remote, key=lambda c: c.path)
    # and it continues from an offset like the local reader
    t_local = Tailer(tmp_path, append=["logs/*.log"])
    t_remote = Tailer(tmp_path, RemoteFiles(LocalRunner("localhost")), append=["logs/*.log"])
    assert t_local.poll().lines == t_remote.poll().lines
    with open(tmp_path / "logs" / "node-0.log", "ab") as fh:
        fh.write(b"ial\n")
    assert t_remote.poll().lines == {"logs/node-0.log": [b"partial"]}


def test_a_failing_helper_is_an_error_with_the_nodes_words(tmp_path):
    # a node whose python cannot run the helper: the node, the helper and its words are named
    (tmp_path / "python").write_text("#!/bin/sh\necho 'Traceback: no module taehv_console' >&2\nexit 1\n")
    (tmp_path / "python").chmod(0o755)
    with pytest.raises(NodeCallError, match="gpu7: tail: exit 1: Traceback: no module taehv_console"):
        RemoteFiles(LocalRunner("gpu7", python=str(tmp_path / "python"))).read(
            str(tmp_path), ["*.log"], [], {}, 1024
        )


def test_tail_over_real_ssh(sshd, tmp_path):
    from taehv_console.core.cluster.ssh import SshPool

    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "rank-0.jsonl").write_bytes(b'{"kind":"start"}\n{"kind":"st')
    with SshPool(sshd.settings()) as pool:
        t = Tailer(tmp_path, RemoteFiles(pool.runner(sshd.hosts[0].host)), append=["events/rank-*.jsonl"])
        assert t.poll().lines == {"events/rank-0.jsonl": [b'{"kind":"start"}']}
        with open(tmp_path / "events" / "rank-0.jsonl", "ab") as fh:
            fh.write(b'ep"}\n')
        assert t.poll().lines == {"events/rank-0.jsonl": [b'{"kind":"step"}']}
