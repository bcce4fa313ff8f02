"""A rank's own stack dump (faulthandler on SIGUSR2, trainer.events.install_stack_dump): real
processes that install it as the trainer does, asked through the node helper, locally, then through
the loopback sshd from a helper without CAP_SYS_PTRACE, where py-spy is refused for real. The signal
ends a process that has no handler, so the cases where it must not be sent are checked on live
processes that would die of it."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from taehv_console.core.cluster.ssh import SshPool, SshSettings
from taehv_console.core.forensics import RankRef, StallForensics, pyspy, selfdump
from tests.core.forensics.conftest import REPO as ROOT
from tests.core.forensics.conftest import make_run, sigstop
from tests.core.forensics.record_fixtures import STUCK
from trainer.events import STACK_HEADER, process_start, stacks_path

# the stand-in rank: installs the handler as Runtime.start does, then waits in a known function
SELF_DUMPING = (
    "import sys\nfrom pathlib import Path\nfrom trainer.events import install_stack_dump\n"
    "install_stack_dump(Path(sys.argv[1]), int(sys.argv[2]))" + STUCK
)


@pytest.fixture
def self_dumping(stuck_process):
    """self_dumping(run, rank, *prefix) -> Popen of a process that dumps its stacks on SIGUSR2."""

    def start(run: Path, rank: int, *prefix: str) -> subprocess.Popen:
        return stuck_process(*prefix, script=SELF_DUMPING, args=(str(run), str(rank)))

    return start


def test_a_rank_dumps_its_stacks_on_the_signal_and_goes_on(self_dumping, tmp_path):
    p = self_dumping(tmp_path, 3)
    file = stacks_path(tmp_path, 3)
    first = selfdump.dump_by_signal(p.pid, file)
    assert first["kind"] == selfdump.OK, first
    dump = selfdump.parse_faulthandler(first["text"], p.pid, first["main"])
    main = dump.main_thread()
    assert main is not None and main.name == "MainThread"
    # where it is, innermost first (faulthandler on 3.11 may give the innermost frame's line one
    # early, so the functions are what is compared)
    assert [f.split(" (")[0] for f in main.frames] == ["wait_for_batch", "train_step", "<module>"]
    assert main.frames[1] == "train_step (<string>:14)"
    assert len(dump.threads) == 2
    assert any(f.startswith("loader_worker (<string>:") for t in dump.threads for f in t.frames)
    second = selfdump.dump_by_signal(p.pid, file)
    assert second["kind"] == selfdump.OK and second["text"] != ""
    assert p.poll() is None  # the signal only dumps: the rank goes on
    text = file.read_text()
    assert text.startswith(f"# taehv stack dumps: pid={p.pid} start={process_start(p.pid)} main=0x")
    assert text.count("most recent call first") == 4  # two dumps of two threads, appended


def test_parse_faulthandler_refuses_text_without_a_thread():
    with pytest.raises(ValueError, match="no thread"):
        selfdump.parse_faulthandler("Fatal Python error: Segmentation fault\n", 1, 0)


def test_no_signal_to_a_process_the_header_does_not_name(stuck_process, tmp_path):
    """The signal's default action ends a process: a rank without the handler (an older trainer),
    or a pid reused by another process, is never sent it. These processes would die of it."""
    p = stuck_process()
    file = stacks_path(tmp_path, 0)
    reply = selfdump.dump_by_signal(p.pid, file)  # no file: the rank never installed the handler
    assert reply["kind"] == selfdump.UNSUPPORTED and "no stack dump handler" in reply["error"], reply
    file.parent.mkdir(parents=True)
    # the pid is right but the start time is another process's: a pid reused after the rank died
    file.write_text(STACK_HEADER.format(pid=p.pid, start=int(process_start(p.pid)) + 1, main=1))
    reply = selfdump.dump_by_signal(p.pid, file)
    assert reply["kind"] == selfdump.UNSUPPORTED and "was not written by process" in reply["error"], reply
    file.write_text(STACK_HEADER.format(pid=p.pid + 1, start=process_start(p.pid), main=1))
    assert selfdump.dump_by_signal(p.pid, file)["kind"] == selfdump.UNSUPPORTED
    time.sleep(0.2)
    assert p.poll() is None  # not signalled: still running


def test_a_stopped_rank_is_not_asked(self_dumping, tmp_path):
    p = self_dumping(tmp_path, 0)
    sigstop(p.pid)
    file = stacks_path(tmp_path, 0)
    size = file.stat().st_size
    reply = selfdump.dump_by_signal(p.pid, file, timeout=1)
    assert reply["kind"] == selfdump.STOPPED and "SIGCONT" in reply["error"], reply
    os.kill(p.pid, signal.SIGCONT)
    time.sleep(0.3)
    assert file.stat().st_size == size  # nothing was pending: it was never signalled


def test_collect_takes_the_ranks_own_stacks_when_pyspy_is_missing(self_dumping, tmp_path, monkeypatch):
    run = make_run(tmp_path)
    stalled, peer = self_dumping(run, 1), self_dumping(run, 0)
    monkeypatch.setattr(pyspy, "find_pyspy", lambda python=None: None)
    with SshPool(SshSettings.from_env()) as pool:
        report = StallForensics(run, pool).collect(
            RankRef(1, 0, "localhost", stalled.pid), RankRef(0, 0, "localhost", peer.pid)
        )
    roles = {d.role: d for d in report.dumps}
    assert set(roles) == {"stalled", "peer"}, report.notes
    s = roles["stalled"]
    assert s.rank == 1 and s.pid == stalled.pid and s.threads == 2
    assert s.frames[0].startswith("wait_for_batch (<string>:")
    path = Path(s.path)
    assert path.parent == run / "forensics" and path.name.startswith("stack-rank1-stalled-")
    assert "faulthandler on SIGUSR2" in path.read_text().splitlines()[0]
    assert sum("py-spy not installed" in n for n in report.notes) == 1  # said once for the node
    assert any("rank 1's stack is the rank's own dump" in n for n in report.notes), report.notes
    assert stalled.poll() is None and peer.poll() is None


needs_root_caps = pytest.mark.skipif(
    os.geteuid() != 0
    or not shutil.which("capsh")
    or not shutil.which("setpriv")
    or pyspy.find_pyspy(sys.executable) is None,
    reason="needs root, capsh and setpriv to drop CAP_SYS_PTRACE for real",
)


@needs_root_caps
def test_a_remote_node_without_sys_ptrace_still_gives_the_ranks_stacks(sshd, self_dumping, tmp_path):
    """What a container without SYS_PTRACE gives: py-spy refused on the node, over real SSH; the
    ranks' own dumps need only the right to signal them, and the report has both stacks."""
    # the ranks run as nobody (so ptrace is refused for real) and write into a run dir they can reach
    root = Path(tempfile.mkdtemp(prefix="taehv-selfdump-", dir="/tmp"))
    try:
        root.chmod(0o777)
        host = sshd.hosts[1].host
        run = make_run(root, nodes=1, gpus_per_node=2, hosts=(host,))
        run.chmod(0o777)
        nobody = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
        stalled, peer = self_dumping(run, 1, *nobody), self_dumping(run, 0, *nobody)
        wrapper = tmp_path / "python-no-ptrace"
        wrapper.write_text(
            textwrap.dedent(f"""\
            #!/bin/sh
            cd {ROOT}
            exec capsh --drop=cap_sys_ptrace -- -c 'exec "$0" "$@"' {sys.executable} "$@"
            """)
        )
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
        shutil.copy(Path(sys.executable).parent / "py-spy", tmp_path / "py-spy")  # found beside the python
        with SshPool(sshd.settings(python=str(wrapper))) as pool:
            report = StallForensics(run, pool).collect(
                RankRef(1, 0, host, stalled.pid), RankRef(0, 0, host, peer.pid)
            )
            assert host in pool._conns  # through SSH, not in-process
        denied = [n for n in report.notes if "not permitted" in n]
        assert len(denied) == 1 and "SYS_PTRACE" in denied[0], report.notes
        roles = {d.role: d for d in report.dumps}
        assert set(roles) == {"stalled", "peer"}, report.notes
        assert roles["stalled"].frames[0].startswith("wait_for_batch (<string>:")
        assert roles["stalled"].host == host
    finally:
        shutil.rmtree(root, ignore_errors=True)


# rank 0 waits in a gloo all-reduce until rank 1, which sleeps first, joins; both print the sum
GLOO_PAIR = """
import sys, time, torch, torch.distributed as dist
from pathlib import Path
from trainer.events import install_stack_dump
rank, port, run = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
install_stack_dump(run, rank)
dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
t = torch.ones(4)
dist.all_reduce(t)
print("ready", flush=True)
if rank == 1:
    time.sleep(float(sys.argv[4]))
dist.all_reduce(t)
print(t.tolist(), flush=True)
dist.destroy_process_group()
"""


def test_a_rank_waiting_in_a_gloo_collective_dumps_and_the_collective_still_completes(tmp_path):
    """The peer forensics asks is blocked inside a collective: the signal lands there (in one of
    its threads, gloo's among them) and must neither break the collective nor the process."""
    from tests.trainer.runs import free_port

    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", GLOO_PAIR, str(rank), port, str(tmp_path), "6"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for rank in (0, 1)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        waiter = procs[0]
        time.sleep(0.5)  # in the second all-reduce, waiting for rank 1
        for _ in range(3):
            reply = selfdump.dump_by_signal(waiter.pid, stacks_path(tmp_path, 0))
            assert reply["kind"] == selfdump.OK, reply
        main = selfdump.parse_faulthandler(reply["text"], waiter.pid, reply["main"]).main_thread()
        assert main is not None and "all_reduce" in main.frames[0], main and main.frames
        outs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0]
    assert all(out.strip().splitlines()[-1] == "[4.0, 4.0, 4.0, 4.0]" for out in outs), outs
