"""runner.call: one reply type and one error for every way a node helper can fail, with a real
helper module run as `python -m` here (a subprocess) and over a real sshd on loopback."""

import sys
import textwrap
import time

import pytest

from taehv_console.core.cluster.nodecall import Failure, NodeCallError, parse_reply, read_reply
from taehv_console.core.cluster.ssh import LocalRunner, SshError, SshPool

HELPER = textwrap.dedent('''
    """A stand-in node helper: its first argument says how to answer."""
    import json, sys, time

    how = sys.argv[1]
    if how == "ok":
        sys.stderr.write("a warning on stderr\\n")
        print(json.dumps({"answer": 42}))
    elif how == "banner":  # a login script that prints before the reply
        print("Welcome to gpu-node-7")
        print(json.dumps({"answer": 42}))
    elif how == "garbage":
        print("Welcome to gpu-node-7")
        print("no reply here")
    elif how == "partial":  # killed in the middle of writing its reply
        sys.stdout.write('{"answer": 4')
    elif how == "exit":
        sys.stderr.write("Traceback (most recent call last):\\nRuntimeError: disk on fire\\n")
        sys.exit(3)
    elif how == "refuse":
        print(json.dumps({"error": "refusing pgid 1"}))
        sys.exit(2)
    elif how == "sleep":
        time.sleep(60)
    elif how == "listen":  # a streamed helper: answers, then runs until stdin closes
        print(json.dumps({"listening": True}), flush=True)
        sys.stdin.read()
    elif how == "die":
        sys.stderr.write("cannot bind: Address already in use\\n")
        sys.exit(1)
''')
MODULE = "nc_helper"


@pytest.fixture
def helper_env(tmp_path):
    (tmp_path / f"{MODULE}.py").write_text(HELPER)
    return {"PYTHONPATH": str(tmp_path)}


def test_a_reply_carries_its_data_stderr_and_time(helper_env):
    reply = LocalRunner("localhost").call(MODULE, ["ok"], env=helper_env, require=("answer",))
    assert reply.ok and reply.error is None and reply.value() == {"answer": 42}
    assert (reply.host, reply.helper) == ("localhost", "nc_helper ok")
    assert reply.stderr_tail == "a warning on stderr" and 0 < reply.elapsed_s < 30
    assert reply.started_at == pytest.approx(time.time(), abs=60)


def test_lines_printed_before_the_reply_are_skipped(helper_env):
    assert LocalRunner().call(MODULE, ["banner"], env=helper_env).value() == {"answer": 42}


@pytest.mark.parametrize(
    ("how", "failure", "words"),
    [
        (
            "garbage",
            Failure.NOT_JSON,
            "localhost: nc_helper garbage: no JSON reply; its output began 'Welcome to gpu-node-7'",
        ),
        ("partial", Failure.NOT_JSON, "localhost: nc_helper partial: its reply is not whole JSON"),
        (
            "exit",
            Failure.EXIT,
            "localhost: nc_helper exit: exit 3: Traceback (most recent call last):\nRuntimeError: disk on fire",
        ),
        ("refuse", Failure.REFUSED, "localhost: nc_helper refuse: refusing pgid 1"),
    ],
)
def test_each_failure_names_the_host_the_helper_and_what_went_wrong(helper_env, how, failure, words):
    reply = LocalRunner().call(MODULE, [how], env=helper_env)
    assert not reply.ok and reply.error is not None and reply.error.failure is failure
    assert str(reply.error).startswith(words), str(reply.error)
    assert reply.error.fix or failure is Failure.REFUSED
    with pytest.raises(NodeCallError) as raised:
        reply.value()
    assert raised.value is reply.error and isinstance(
        raised.value, SshError
    )  # callers catching SshError see it


def test_missing_keys_are_named(helper_env):
    reply = LocalRunner().call(MODULE, ["ok"], env=helper_env, require=("answer", "pid", "pgid"))
    assert reply.error is not None and reply.error.failure is Failure.MISSING_KEYS
    assert "nc_helper ok: its reply lacks pid, pgid" in str(reply.error)


def test_a_helper_past_its_timeout_is_killed_and_reported(helper_env):
    t0 = time.monotonic()
    reply = LocalRunner().call(MODULE, ["sleep"], env=helper_env, timeout=1)
    assert time.monotonic() - t0 < 10  # not the helper's 60 s
    assert reply.error is not None and reply.error.failure is Failure.TIMEOUT
    assert str(reply.error) == "localhost: nc_helper sleep: did not finish within 1 s"


def test_a_missing_interpreter_says_to_pass_the_nodes_python(helper_env):
    reply = LocalRunner("localhost", python="/nonexistent/python3").call(MODULE, ["ok"], env=helper_env)
    assert reply.error is not None and reply.error.failure is Failure.EXIT
    assert "/nonexistent/python3" in str(reply.error) and "--python" in reply.error.fix


def test_the_in_process_path_answers_like_the_helper():
    # run/node refuses pgid 1 with exit 2; in-process it has no exit status, yet reads the same
    node = "taehv_console.core.run.node"
    from taehv_console.core.run import node as node_mod

    def here(args):
        return node_mod.tree_command(node_mod.build_parser().parse_args(args))

    runner = LocalRunner()
    spawned = runner.call(node, ["pids", "--pgid", "1"], require=("pids",))
    inproc = runner.call(node, ["pids", "--pgid", "1"], require=("pids",), in_process=here)
    assert spawned.error is not None and inproc.error is not None
    assert str(spawned.error) == str(inproc.error) == "localhost: node pids: refusing pgid 1"

    def crash(_args):
        raise RuntimeError("no /proc here")

    broken = runner.call(node, ["pids", "--pgid", "5"], in_process=crash)
    assert "localhost: node pids: cannot run: RuntimeError: no /proc here" == str(broken.error)


def test_a_streamed_helper_is_read_by_the_one_reader(helper_env):
    runner = LocalRunner()
    stream = runner.open(
        ["env", f"PYTHONPATH={helper_env['PYTHONPATH']}", sys.executable, "-m", MODULE, "listen"]
    )
    try:
        first = read_reply(stream, "localhost", "nc_helper listen", 20)
        assert first.ok and first.get("listening") is True
        again = read_reply(stream, "localhost", "nc_helper listen", 0.3)  # nothing more: a timeout
        assert again.error is not None and again.error.failure is Failure.TIMEOUT and not stream.exited
    finally:
        stream.close()
    died = runner.open(["env", f"PYTHONPATH={helper_env['PYTHONPATH']}", sys.executable, "-m", MODULE, "die"])
    try:
        reply = read_reply(died, "localhost", "nc_helper die", 20)
    finally:
        died.close()
    assert reply.error is not None and reply.error.failure is Failure.EXIT
    assert (
        str(reply.error)
        == "localhost: nc_helper die: ended without a reply: cannot bind: Address already in use"
    )


def test_a_partial_last_line_is_reported_not_dropped():
    # what a helper killed mid-write leaves: the reader hands the fragment over at EOF
    stream = LocalRunner().open([sys.executable, "-c", "import sys; sys.stdout.write('{\"listening\": tr')"])
    try:
        reply = read_reply(stream, "gpu3", "nodecheck listen", 20)
    finally:
        stream.close()
    assert reply.error is not None and reply.error.failure is Failure.NOT_JSON
    assert str(reply.error).startswith("gpu3: nodecheck listen: its reply is not whole JSON")


def test_parse_reply_on_recorded_outputs():
    assert parse_reply("n1", "probe", "").error.detail == "no JSON reply (no output)"  # type: ignore[union-attr]
    assert parse_reply("n1", "probe", "[1, 2]").error.failure is Failure.NOT_JSON  # type: ignore[union-attr]
    cut = parse_reply("n1", "probe", "", "x" * 5000, 1).error  # a long traceback: its tail is kept
    assert cut is not None and len(cut.detail) < 500 and cut.detail.endswith("x")


def test_over_ssh_the_same_replies(sshd, sshd_hosts, helper_env):
    with SshPool(sshd.settings()) as pool:
        host = sshd_hosts[0].host
        ok = pool.call(host, MODULE, ["banner"], env=helper_env, require=("answer",))
        bad = pool.call(host, MODULE, ["exit"], env=helper_env)
        slow = pool.call(host, MODULE, ["sleep"], env=helper_env, timeout=1)
        gone = pool.call("127.0.0.9", MODULE, ["ok"], env=helper_env)  # nothing listens there
        replies = pool.call_all([host, sshd_hosts[1].host], MODULE, ["ok"], env=helper_env)
    assert ok.ok and ok.value() == {"answer": 42} and ok.host == host
    assert bad.error is not None and bad.error.failure is Failure.EXIT
    assert str(bad.error).startswith(f"{host}: nc_helper exit: exit 3: Traceback") and "disk on fire" in str(
        bad.error
    )
    assert (
        slow.error is not None and slow.error.failure is Failure.TIMEOUT and "within 1 s" in str(slow.error)
    )
    assert gone.error is not None and gone.error.failure is Failure.UNREACHABLE
    assert str(gone.error).startswith("127.0.0.9: nc_helper ok: cannot connect") and gone.error.fix
    assert [r.get("answer") for r in replies.values()] == [42, 42]


def test_over_ssh_a_streamed_helper_that_dies_says_why(sshd, sshd_hosts, helper_env):
    # the remote stream sees its channel end and keeps the helper's stderr, as the local one does
    with SshPool(sshd.settings()) as pool:
        runner = pool.runner(sshd_hosts[0].host)
        stream = runner.open(
            ["env", f"PYTHONPATH={helper_env['PYTHONPATH']}", runner.python, "-m", MODULE, "die"]
        )
        try:
            reply = read_reply(stream, runner.host, "nc_helper die", 20)
        finally:
            stream.close()
    assert stream.exited and reply.error is not None and reply.error.failure is Failure.EXIT
    assert (
        str(reply.error)
        == f"{runner.host}: nc_helper die: ended without a reply: cannot bind: Address already in use"
    )


def test_the_agent_stream_reads_every_line_then_the_exit_and_its_reason(tmp_path):
    from taehv_console.core.watch.streams import LocalLineStream

    code = (
        "import sys; print('a'); print('b'); sys.stderr.write('agent: NVML gone\\n'); sys.stdout.write('c')"
    )
    stream = LocalLineStream([sys.executable, "-c", code])
    lines: list[str] = []
    deadline = time.monotonic() + 20
    try:
        while not stream.exited and time.monotonic() < deadline:  # the poller's loop, never blocking
            lines += stream.read_lines()
            time.sleep(0.02)
        lines += stream.read_lines()
    finally:
        stream.close()
    assert lines == ["a", "b", "c"] and stream.exited
    assert stream.stderr_tail == b"agent: NVML gone\n"
