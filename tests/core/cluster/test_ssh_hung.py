"""A hung node: a real sshd frozen with SIGSTOP (it and the processes serving its connections), so
an established connection stops answering while the kernel keeps the TCP session open. The call
to it returns "unreachable" within the deadline, the other nodes answer meanwhile, later calls do
not wait again, and the node comes back by itself once it is thawed."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

from taehv_console.core.cluster.ssh import SshPool, SshSettings, SshUnreachableError
from tests.conftest import LoopbackSshd, find_sshd, process_tree

pytestmark = pytest.mark.timeout(120)

ANSWER_S = 2.0


class FrozenNode:
    """A second sshd on its own address, which the test can freeze and thaw."""

    def __init__(self, workdir: Path):
        self.server = LoopbackSshd(workdir, n_hosts=1, first=121).start()
        self.host = self.server.hosts[0]
        self._stopped: list[int] = []

    def freeze(self) -> None:
        self._stopped = process_tree(self.server._proc.pid)  # the daemon this test started, and its children
        for p in self._stopped:
            os.kill(p, signal.SIGSTOP)

    def thaw(self) -> None:
        for p in self._stopped:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self._stopped = []

    def stop(self) -> None:
        self.thaw()
        self.server.stop()


@pytest.fixture
def frozen_node():
    if find_sshd() is None:
        pytest.skip("sshd not installed")
    workdir = Path(tempfile.mkdtemp(prefix="taehv-sshd-hung-"))
    node = FrozenNode(workdir)
    try:
        yield node
    finally:
        node.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def combined_settings(sshd, frozen: FrozenNode, tmp_path: Path) -> SshSettings:
    """One ssh_config and known_hosts for both daemons: the frozen one as alias `hung1`."""
    h = frozen.host
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host hung1\n  HostName {h.host}\n  Port {h.port}\n  User {h.user}\n"
        f"  IdentityFile {h.key_path}\n  IdentitiesOnly yes\n\n" + Path(sshd.ssh_config).read_text()
    )
    known = tmp_path / "known_hosts"
    known.write_text(Path(sshd.known_hosts).read_text() + Path(frozen.server.known_hosts).read_text())
    return SshSettings(
        config_path=str(config),
        known_hosts_path=str(known),
        system_known_hosts_path=None,
        connect_timeout_s=ANSWER_S,
        answer_timeout_s=ANSWER_S,
        retry_unreachable_s=0.5,
        command_timeout_s=30.0,
        allow_agent=False,
        python=sys.executable,
    )


def hung_node_report(sshd, sshd_hosts, frozen_node, tmp_path) -> float:
    """Freeze a connected node mid-run; returns the seconds until it is reported unreachable."""
    healthy = [h.alias for h in sshd_hosts[:2]]
    hosts = ["hung1", *healthy]
    with SshPool(combined_settings(sshd, frozen_node, tmp_path)) as pool:
        first = pool.run_all(hosts, ["echo", "up"], timeout=20)
        assert all(not isinstance(r, Exception) and r.stdout == "up\n" for r in first.values()), first
        frozen_node.freeze()

        t0 = time.monotonic()
        second = pool.run_all(hosts, ["echo", "up"], timeout=20)
        seconds = time.monotonic() - t0
        assert isinstance(second["hung1"], SshUnreachableError), second["hung1"]
        assert "hung1: unreachable" in str(second["hung1"]) and f"within {ANSWER_S:g} s" in str(
            second["hung1"]
        )
        assert all(second[h].stdout == "up\n" for h in healthy)  # the others answered meanwhile
        assert seconds < ANSWER_S + 3, seconds  # one deadline, not the command timeout (20 s)

        # while it stays frozen, a poll costs nothing for it: no second wait
        t1 = time.monotonic()
        third = pool.run_all(hosts, ["echo", "up"], timeout=20)
        assert isinstance(third["hung1"], SshUnreachableError) and "reconnecting" in str(third["hung1"])
        assert time.monotonic() - t1 < 1.5 and all(third[h].ok for h in healthy)

        frozen_node.thaw()  # back: the background reconnection finds it
        deadline = time.monotonic() + 30
        while pool.is_down("hung1") and time.monotonic() < deadline:
            pool.run_all(["hung1"], ["true"], timeout=5)
            time.sleep(0.2)
        assert pool.runner("hung1").run(["echo", "back"]).stdout == "back\n"
    return seconds


def test_a_frozen_node_is_unreachable_within_the_deadline_and_others_answer(
    sshd, sshd_hosts, frozen_node, tmp_path
):
    seconds = hung_node_report(sshd, sshd_hosts, frozen_node, tmp_path)
    print(f"hung node reported unreachable after {seconds:.2f} s (answer deadline {ANSWER_S:g} s)")
