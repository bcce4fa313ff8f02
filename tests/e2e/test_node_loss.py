"""A node lost in the middle of a run, on real parts: two loopback "nodes" train one CPU DeepSpeed
run (gloo, ZeRO-2, one rank each) through `taehv-console --no-tui` over the real sshd; node 1 runs
behind an sshd of its own (127.0.0.6), and losing it means what losing a machine means: that sshd
and every process on the node are killed, so the console cannot reach it and rank 0 loses its peer.

- without a spare: node 1 is left out at once (it cannot be reached); the newest checkpoint is
  converted to a universal one and the run goes on with one node from it, step, LR and data
  position continuing, to final weights;
- with a spare (--spares, 127.0.0.4 on the main sshd): preflight passes on the spare, it takes
  node 1's place, and the run goes on at the same world size to final weights.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from taehv_console.headless import ExitCode
from tests.conftest import LoopbackSshd, process_tree
from tests.e2e.consoles import SMALL_RUN, Console, events, free_port, is_step, run_state
from trainer import checkpoint as ckpt
from trainer.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NODE0, LOST, SPARE = "127.0.0.2", "127.0.0.6", "127.0.0.4"
KEYS = ("client_ed25519", "client_ed25519.pub", "ssh_host_ed25519_key", "ssh_host_ed25519_key.pub")


@pytest.fixture
def node_sshd(sshd, tmp_path):
    """An sshd of its own for 127.0.0.6, with the main server's keys and port (so the console's ssh
    config reaches it), and a known_hosts that lists both servers' addresses."""
    own = tmp_path / "node-sshd"
    own.mkdir()
    for name in KEYS:
        shutil.copy(Path(sshd.dir) / name, own / name)
    server = LoopbackSshd(own, n_hosts=1, first=6).start(port=sshd.port)
    known = tmp_path / "known_hosts"
    known.write_text(Path(sshd.known_hosts).read_text() + Path(server.known_hosts).read_text())
    try:
        yield server, known
    finally:
        server.stop()
        _kill_tree_of(server)


def _kill_tree_of(server: LoopbackSshd) -> None:
    proc = server._proc
    if proc is None:
        return
    for pid in process_tree(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def lose_node(server: LoopbackSshd, run: Path, how: signal.Signals = signal.SIGKILL) -> list[int]:
    """What a machine's death looks like from the rest of the cluster: its sshd and sessions gone
    (nothing can reach it), and its launcher and ranks gone (SIGKILL: their peers lose them) or
    frozen (SIGSTOP: a hung machine, whose peers wait on it). Returns the node's pids."""
    node1 = next(n for n in run_state(run)["attempts"][-1]["nodes"] if n["index"] == 1)
    _kill_tree_of(server)
    pids = process_tree(node1["pid"])
    for pid in pids:
        try:
            os.kill(pid, how)
        except ProcessLookupError:
            pass
    return pids


def console(tmp_path: Path, sshd, known: Path, *extra: str) -> Console:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"{NODE0} slots=1\n{LOST} slots=1\n")
    env = {**os.environ, **sshd.env(), "TAEHV_KNOWN_HOSTS": str(known)}
    return Console(
        "--no-tui",
        "--hosts",
        hostfile,
        "--runs",
        tmp_path / "runs",
        "--master-port",
        free_port(),
        "--json",
        "--set",
        "optim.max_steps=14",
        "--set",
        "schedule.checkpoint_every=4",
        "--set",
        "schedule.val_every=1000",
        "--set",
        "recovery.backoff_s=1",
        *SMALL_RUN,
        *extra,
        env=env,
        cwd=tmp_path,
    )


def _run_after_loss(
    c: Console, tmp_path: Path, server: LoopbackSshd, how: signal.Signals = signal.SIGKILL
) -> Path:
    phase = c.wait_for(lambda o: o.get("kind") == "phase", 240, "the run to start")
    run = tmp_path / "runs" / phase["run"]
    c.wait_for(lambda o: is_step(o, 6), 400, "step 6, after the checkpoint at step 4")
    pids = lose_node(server, run, how)
    try:
        rc = c.wait(600)
    finally:
        for pid in pids:  # a frozen "machine" on loopback: nothing of it may outlive the test
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert rc == ExitCode.DONE, c.tail()
    assert (run / "final" / "taehv.safetensors").is_file()
    return run


def _steps_continue(run: Path, from_step: int) -> tuple[dict, dict]:
    """The first step after the resume, and the same step as the failed attempt trained it."""
    steps = events(run, 0, "step")
    again = [e for e in steps if e["step"] == from_step + 1]
    assert len(again) >= 2, f"step {from_step + 1} should be trained by both attempts: {again}"
    return again[0], again[-1]


def test_a_lost_node_without_a_spare_is_left_out_and_the_run_ends_on_one_node(sshd, node_sshd, tmp_path):
    server, known = node_sshd
    c = console(tmp_path, sshd, known)
    run = _run_after_loss(c, tmp_path, server)
    state = run_state(run)
    first, second = state["attempts"][0], state["attempts"][-1]
    assert (first["cause"], first["decision"], first["blamed_node"]) == ("node-lost", "exclude", 1), first
    assert "cannot be reached" in first["why"], first["why"]
    assert second["restarted_by"] == "recovery" and second["outcome"] == "done", second
    assert second["from_step"] in (4, 8) and [n["host"] for n in second["nodes"]] == [NODE0]
    (left_out,) = state["exclusions"]
    assert (left_out["node"], left_out["host"], left_out["replaced_by"]) == (1, LOST, None), left_out
    assert (left_out["nodes_before"], left_out["nodes_after"]) == (2, 1)
    assert Path(left_out["checkpoint"]).name == f"step-{second['from_step']}", left_out
    assert list(state["hosts"]) == [NODE0]
    # run.toml is the one-node config, with the effective batch kept through accumulation
    cfg = load_config(run / "run.toml")
    assert cfg.topology.nodes == 1 and cfg.topology.world_size == 1 and cfg.optim.grad_accum == 2
    assert any("topology.nodes: 2 -> 1" in line for line in left_out["changes"]), left_out["changes"]
    assert any("optim.grad_accum: 1 -> 2" in line for line in left_out["changes"]), left_out["changes"]
    # the universal checkpoint was loaded at world size 1; step and LR go on where they were
    log = (run / "logs" / "node-0.log").read_text()
    assert "loaded the universal checkpoint" in log and "(written by 2 processes) at 1" in log
    before, after = _steps_continue(run, second["from_step"])
    assert after["lr"] == pytest.approx(before["lr"]), (before, after)
    start = [e for e in events(run, 0, "start") if e.get("world_size") == 1]
    assert start and start[-1]["step"] == second["from_step"], start
    final = ckpt.scan(run / "checkpoints").newest
    assert final is not None and final.step == 14 and final.world_size == 1
    notes = [o.get("message", "") for o in c.lines if o.get("kind") == "note"]
    assert any("node 1 (127.0.0.6) left out: the run goes on with 1 node(s)" in n for n in notes), notes
    print(f"\nnode lost -> training again on one node: {second['lost_s']} s, {second['redone_steps']} redone")


def test_a_lost_node_with_a_spare_is_replaced_and_the_world_size_kept(sshd, node_sshd, tmp_path):
    server, known = node_sshd
    spares = tmp_path / "spares"
    spares.write_text(f"{SPARE} slots=1\n")
    c = console(tmp_path, sshd, known, "--spares", str(spares))
    run = _run_after_loss(c, tmp_path, server)
    state = run_state(run)
    first, second = state["attempts"][0], state["attempts"][-1]
    assert (first["cause"], first["decision"], first["blamed_node"]) == ("node-lost", "exclude", 1), first
    assert [n["host"] for n in second["nodes"]] == [NODE0, SPARE] and second["outcome"] == "done", second
    (left_out,) = state["exclusions"]
    assert (left_out["host"], left_out["replaced_by"], left_out["nodes_after"]) == (LOST, SPARE, 2)
    assert left_out["checkpoint"] is None  # the same world size: the checkpoint loads as it is
    assert list(state["hosts"]) == [NODE0, SPARE] and list(state["spares"]) == [SPARE]
    assert load_config(run / "run.toml").topology.nodes == 2
    assert SPARE in (run / "hostfile").read_text() and LOST not in (run / "hostfile").read_text()
    before, after = _steps_continue(run, second["from_step"])
    assert after["lr"] == pytest.approx(before["lr"])
    final = ckpt.scan(run / "checkpoints").newest
    assert final is not None and final.step == 14 and final.world_size == 2
    notes = [o.get("message", "") for o in c.lines if o.get("kind") == "note"]
    assert any(f"spare {SPARE} passed preflight" in n for n in notes), notes
    print(
        f"\nnode lost -> training again on the spare: {second['lost_s']} s, {second['redone_steps']} redone"
    )
    assert json.loads((run / "state.json").read_text())["exclusions"][0]["why"]


def test_a_hung_node_that_cannot_be_reached_counts_as_lost_after_the_bound_and_is_left_out(
    sshd, node_sshd, tmp_path
):
    """The machine freezes (its ranks SIGSTOPped) and drops off the network: rank 0 waits in its
    collective without an error, so only the bound on an unreachable node with no step ends it,
    long before the collective timeout."""
    server, known = node_sshd
    # the stall bound (cpu-smoke: 60 s) would end the attempt too; this test is about the other bound
    bound = 20
    c = console(
        tmp_path,
        sshd,
        known,
        "--set",
        "recovery.stall_restart_after_s=600",
        "--set",
        f"recovery.node_lost_after_s={bound}",
    )
    run = _run_after_loss(c, tmp_path, server, signal.SIGSTOP)
    state = run_state(run)
    first, second = state["attempts"][0], state["attempts"][-1]
    assert (first["cause"], first["decision"], first["blamed_node"]) == ("node-lost", "exclude", 1), first
    assert "cannot be reached" in first["why"] and second["outcome"] == "done"
    # named once the bound had passed with no step, not at the first missed answer
    assert first["detected"] - first["last_step_at"] >= bound, first
    assert state["exclusions"][0]["nodes_after"] == 1
    print(f"\nhung node lost -> training again on one node: {second['lost_s']} s")
