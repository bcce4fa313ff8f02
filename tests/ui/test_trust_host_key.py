"""Host-key trust in the TUI is exactly the key shown: between the fingerprint dialog and the
user's yes, the server on the node's address is replaced by one with another host key (two real
sshd, one after the other on the same address and port). The console must add the key the user
saw, not the one served after it, so the new server is refused as a changed key."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import LoopbackSshd, find_sshd
from tests.ui.conftest import sample_app, wait_until

pytestmark = [pytest.mark.timeout(180)]

ADDRESS_OCTET = 157  # an address of this test's own: the shared fixture uses 127.0.0.2-5


def _host_key(server: LoopbackSshd) -> str:
    return Path(server.host_key_path + ".pub").read_text().split()[1]


def test_the_tui_trusts_the_key_it_showed_not_one_served_after_the_confirmation(tmp_path, monkeypatch):
    if find_sshd() is None:
        pytest.skip("sshd not installed (apt-get install openssh-server)")
    from taehv_console.ui.screens.detect import DetectScreen

    first = LoopbackSshd(tmp_path / "first", n_hosts=1, first=ADDRESS_OCTET).start()
    second = None
    try:
        host = first.addresses[0]
        known_hosts = tmp_path / "known_hosts"
        known_hosts.write_text("")  # nothing trusted yet
        monkeypatch.setenv("TAEHV_SSH_CONFIG", first.ssh_config)
        monkeypatch.setenv("TAEHV_KNOWN_HOSTS", str(known_hosts))
        monkeypatch.setenv("TAEHV_REMOTE_PYTHON", sys.executable)
        hostfile = first.write_hostfile(tmp_path / "hostfile", slots=1)
        app = sample_app("--hosts", str(hostfile), "--runs", str(tmp_path / "runs"))

        async def go():
            nonlocal second
            async with app.run_test(size=(120, 40)) as pilot:
                await app.push_screen(DetectScreen())
                await wait_until(pilot, lambda: app.wizard.topology is not None, 120, "detection")
                detect = app.screen
                assert not app.wizard.probes[0].ok and "taehv-console trust" in app.wizard.probes[0].fix
                await pilot.press("T")
                await wait_until(
                    pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", 30, "the fingerprint"
                )
                shown = str(app.screen.body)
                assert "SHA256:" in shown and host in shown

                # the user reads the fingerprint; meanwhile another server takes the address and port
                first.stop()
                (tmp_path / "second").mkdir()
                for name in ("client_ed25519", "client_ed25519.pub"):  # the same client may log in
                    shutil.copy(Path(first.dir) / name, tmp_path / "second" / name)
                second = LoopbackSshd(tmp_path / "second", n_hosts=1, first=ADDRESS_OCTET).start(
                    port=first.port
                )
                assert _host_key(second) != _host_key(first)

                await pilot.press("y")
                await wait_until(
                    pilot,
                    lambda: (
                        detect._results.get(host) is not None
                        and detect._results[host] is not app.wizard.probes[0]
                    ),
                    60,
                    "the probe after trusting",
                )
                after = detect._results[host]
                # the shown key was trusted, so the server now answering is refused as a changed key
                assert not after.ok and "HOST KEY CHANGED" in after.error and "--replace" in after.fix
                trusted = known_hosts.read_text()
                assert _host_key(first) in trusted and _host_key(second) not in trusted

        asyncio.run(go())
    finally:
        first.stop()
        if second is not None:
            second.stop()
