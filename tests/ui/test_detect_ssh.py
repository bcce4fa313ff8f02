"""The Detect step against a real OpenSSH server (the loopback sshd fixture): a hostfile of two
nodes, one whose host key is not in known_hosts. Its row says so; T shows the key's fingerprint
and, confirmed, adds it to known_hosts and probes the node again, which now answers."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.ui.conftest import sample_app, wait_until

pytestmark = [pytest.mark.timeout(180)]


def test_detect_over_ssh_offers_to_trust_an_unknown_host_key(sshd, tmp_path, monkeypatch):
    from taehv_console.ui.screens.detect import DetectScreen

    known, unknown = sshd.addresses[0], sshd.addresses[1]
    known_hosts = tmp_path / "known_hosts"
    lines = Path(sshd.known_hosts).read_text().splitlines()
    known_hosts.write_text("".join(line + "\n" for line in lines if not line.startswith(f"[{unknown}]")))
    monkeypatch.setenv("TAEHV_SSH_CONFIG", sshd.ssh_config)
    monkeypatch.setenv("TAEHV_KNOWN_HOSTS", str(known_hosts))
    monkeypatch.setenv("TAEHV_REMOTE_PYTHON", sys.executable)
    hostfile = sshd.write_hostfile(tmp_path / "hostfile", slots=1, hosts=[known, unknown])
    app = sample_app("--hosts", str(hostfile), "--runs", str(tmp_path / "runs"))

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await app.push_screen(DetectScreen())
            await wait_until(pilot, lambda: app.wizard.topology is not None, 120, "detection")
            probes = {p.host: p for p in app.wizard.probes}
            assert probes[known].ok and not probes[unknown].ok
            assert "taehv-console trust" in probes[unknown].fix
            table = app.screen.query_one("#nodes")
            assert "host key unknown" in str(table.get_row(unknown)[2])
            table.move_cursor(row=1)
            await pilot.press("T")
            await wait_until(
                pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", 30, "the fingerprint"
            )
            body = str(app.screen.body)
            assert "SHA256:" in body and unknown in body and str(known_hosts) in body
            await pilot.press("y")
            detect = app.screen_stack[-1]
            await wait_until(
                pilot,
                lambda: (
                    getattr(detect, "_results", {}).get(unknown) is not None and detect._results[unknown].ok
                ),
                60,
                "the trusted node to answer",
            )
            assert f"[{unknown}]:{sshd.port}" in known_hosts.read_text()

    asyncio.run(go())
