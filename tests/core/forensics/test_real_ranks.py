"""Forensics on real torch.distributed ranks (gloo, 2 processes): rank 1 is SIGSTOPped in its
"data loading" while rank 0 waits in all_reduce. The stacks say exactly that."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from taehv_console.core.cluster.ssh import SshPool, SshSettings
from taehv_console.core.forensics import RankRef, StallForensics
from taehv_console.core.forensics.pyspy import find_pyspy
from tests.core.forensics.conftest import make_run, sigstop

RANK = """
import sys, time, torch, torch.distributed as dist
rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
def load_batch():
    print("loading", flush=True)
    time.sleep(3600)
def train_step(step):
    if rank == 1 and step == 2:
        load_batch()
    t = torch.ones(4)
    dist.all_reduce(t)
for step in range(3):
    train_step(step)
"""


@pytest.mark.slow
@pytest.mark.skipif(find_pyspy(sys.executable) is None, reason="py-spy not installed")
def test_stopped_rank_and_waiting_peer(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(r), port], env=env, stdout=subprocess.PIPE, text=True
        )
        for r in (0, 1)
    ]
    try:
        assert ranks[1].stdout.readline().strip() == "loading"
        sigstop(ranks[1].pid)
        run = make_run(tmp_path, device="cpu", nodes=1, gpus_per_node=2)
        with SshPool(SshSettings.from_env()) as pool:
            report = StallForensics(run, pool).collect(
                RankRef(1, 0, "localhost", ranks[1].pid), RankRef(0, 0, "localhost", ranks[0].pid)
            )
        by_role = {d.role: d for d in report.dumps}
        stalled = by_role["stalled"].frames
        assert stalled[0].startswith("load_batch (<string>:") and stalled[1] == "train_step (<string>:10)"
        peer = by_role["peer"].frames
        assert any(f.startswith("all_reduce (") for f in peer), peer
        assert any(f.startswith("train_step (<string>:12)") for f in peer), peer
    finally:
        for p in ranks:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait(timeout=30)
