"""The fault matrix: one named test per fault a user can meet, each on real parts (processes and
signals, sshd on loopback, DeepSpeed on CPU, real video files and checkpoints, tmpfs for a full
disk). The README's "What each fault looks like" table is this file in words.

Costly parts run once and are shared: one real training timeline (a kill -9 mid-save, a resume,
a resume --from an older checkpoint, a corrupt clip in its data) feeds cases 6, 8, 9, 10 and 13;
the other cases use the fake torchrun launchers of tests/core/run (real processes and sessions,
no DeepSpeed) or call the core directly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import paramiko
import pytest
import tomli_w
import tomllib

from taehv_console.cli import main
from taehv_console.core.cluster import preflight as pf
from taehv_console.core.cluster.hosts import HostfileError, parse_hostfile
from taehv_console.core.cluster.ssh import (
    HostKeyChangedError,
    HostKeyUnknownError,
    SshError,
    SshPool,
    connect,
)
from taehv_console.core.logscan import LogScanner
from taehv_console.core.plan.presets import load_preset
from taehv_console.core.run.control import RunController
from taehv_console.core.run.failure import choose_failure
from taehv_console.core.run.state import Phase
from taehv_console.core.watch.checkpoints import CheckpointWatcher, RunActivity
from taehv_console.core.watch.health import HealthPolicy
from taehv_console.core.watch.monitor import Monitor, MonitorConfig, PollerConfig
from taehv_console.core.watch.state import CheckpointState, RankState
from tests.conftest import process_tree
from tests.core.cluster.conftest import build_facts
from tests.core.cluster.test_preflight_checks import cfg as gpu_config
from tests.core.cluster.test_preflight_checks import hostfile_topology
from tests.core.cluster.test_ssh_hung import (  # noqa: F401 - frozen_node is a fixture used here
    combined_settings,
    frozen_node,
    hung_node_report,
)
from tests.core.plan.test_render_injection import write_preset
from tests.core.run.conftest import (  # noqa: F401 - launch_fake and pool are fixtures used here
    alive,
    launch_fake,
    launch_then_kill_console,
    make_run,
    pool,
    rank_pid,
    step_of,
    wait_for,
)
from tests.core.run.fake_launcher import fake_commands
from tests.core.watch.conftest import FIXTURES
from tests.trainer.conftest import clip_dir  # noqa: F401 - a fixture used here
from tests.trainer.runs import Launch, base_config, events, run_to_end, write_run
from tests.trainer.runs import wait_for as wait_for_run
from trainer import checkpoint as ckpt
from trainer.config import ConfigError
from trainer.synthetic import make_synthetic

pytestmark = [pytest.mark.timeout(900)]


# ------------------------------------------------------------------ shared: a real timeline


def _set(run: Path, section: str, **values) -> None:
    cfg = tomllib.loads((run / "run.toml").read_text())
    cfg.setdefault(section, {}).update(values)
    (run / "run.toml").write_text(tomli_w.dumps(cfg))


@pytest.fixture(scope="module")
def timeline(tmp_path_factory) -> dict:
    """One DeepSpeed process (ZeRO-2), clips with one corrupt video, a save every 2 steps, keep 2.
    1. killed with -9 while saving step 4 (the ranks sleep inside the save);
    2. `--resume latest` to step 6;
    3. `--resume step-4` (an older checkpoint) to step 5.
    Returns the run directory and what each leg left behind."""
    base = tmp_path_factory.mktemp("timeline")
    clips = base / "clips"
    make_synthetic(clips, clips=6, frames=12, height=64, width=64, seed=3)
    (clips / "zz_corrupt.mp4").write_bytes(b"\x00\x00\x00\x18ftypisom" + os.urandom(4000))
    run = write_run(
        base / "run",
        base_config(
            clips,
            topology={"gpus_per_node": 1},
            optim={"max_steps": 6},
            data={"val_fraction": 0.0},
            schedule={"checkpoint_every": 2, "val_every": 100, "keep_checkpoints": 2},
        ),
    )
    root = run / "checkpoints"
    out: dict = {"run": run, "root": root}

    launch = Launch(run, 1, env={"TAEHV_FAULTS": "ckpt_sleep:0:4:300"})
    rank_pid_ = None
    try:
        wait_for_run(lambda: (root / "step-4.tmp" / ckpt.WEIGHTS).exists(), 400, "step 4's files", launch)
        # kill -9 the rank mid-save (torchrun runs ranks in sessions of their own: by pid); its
        # launcher then fails by itself
        rank_pid_ = json.loads((run / "heartbeat" / "rank-0.json").read_text())["pid"]
        os.kill(rank_pid_, signal.SIGKILL)
        assert launch.wait(120) != 0
    finally:
        if launch.proc.poll() is None:  # a failure above: leave no sleeping rank behind
            if rank_pid_ is None and (run / "heartbeat" / "rank-0.json").exists():
                rank_pid_ = json.loads((run / "heartbeat" / "rank-0.json").read_text())["pid"]
            if rank_pid_ and alive(rank_pid_):
                os.kill(rank_pid_, signal.SIGKILL)
            launch.kill()
    out["after_kill"] = {p.name for p in root.iterdir()}
    out["latest_after_kill"] = ckpt.read_latest(root)
    out["resolved_after_kill"] = ckpt.resolve_resume(root, "latest")
    out["watch_after_kill"] = CheckpointWatcher(root).summary(RunActivity(live=False, step=4, every=2))
    out["data_events"] = events(run, 0, "data")
    # a copy of the real step-2 checkpoint for the damage cases
    out["spare"] = base / "spare"
    shutil.copytree(root / "step-2", out["spare"] / "step-2")

    run_to_end(run, 1, ("--resume", "latest"))
    out["start_2"] = events(run, 0, "start")[-1]
    out["after_resume"] = sorted(p.name for p in root.iterdir())

    _set(run, "optim", max_steps=5)
    run_to_end(run, 1, ("--resume", str(root / "step-4")))
    out["start_3"] = events(run, 0, "start")[-1]
    out["after_resume_from"] = sorted(p.name for p in root.iterdir())
    return out


# ------------------------------------------------------------------ 1. kill -9 of a rank


def test_01_kill_9_of_a_rank_fails_the_run_naming_node_and_rank(launch_fake):
    ctrl = launch_fake(nodes=2, step_s=0.2)
    wait_for(lambda: step_of(ctrl) >= 2, 60, "two steps")
    victim, survivor = rank_pid(ctrl.run, 1), rank_pid(ctrl.run, 0)
    os.kill(victim, signal.SIGKILL)
    outcome = ctrl.follow(interval=0.1)
    assert outcome.phase is Phase.FAILED
    f = outcome.failure
    assert (f.node, f.rank, f.exit_code) == (1, 1, -9) and "signal 9" in f.reason
    assert not alive(survivor)  # the healthy node was stopped, not left hanging in a collective


# ------------------------------------------------------------------ 2. a SIGSTOPped rank


def test_02_a_sigstopped_rank_is_reported_stalled_and_recovers_on_sigcont(launch_fake):
    ctrl = launch_fake(nodes=1, per_node=2, step_s=0.2)
    wait_for(lambda: step_of(ctrl) >= 3, 60, "three steps")
    fast = PollerConfig(0.2, 10.0, 2.0)
    config = MonitorConfig(
        events=fast,
        heartbeats=fast,
        logs=fast,
        agents=fast,
        publish_interval_s=0.2,
        # the fake ranks report no step times: the start-up limit is the one that applies
        health=HealthPolicy(stall_factor=2.0, stall_floor_s=1.0, startup_grace_s=3.0, pause_grace_s=1.0),
    )
    pid = rank_pid(ctrl.run, 1)
    with Monitor(ctrl.run.path, config=config) as mon:
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(
                lambda: (r := mon.snapshot().rank(1)) and r.state is RankState.STALLED, 30, "rank 1 stalled"
            )
            assert mon.snapshot().rank(0).state is not RankState.STALLED
        finally:
            os.kill(pid, signal.SIGCONT)
        # fake ranks report no step times, so a live one reads "starting" rather than "healthy"
        wait_for(lambda: mon.snapshot().rank(1).state is not RankState.STALLED, 30, "rank 1 going again")


# ------------------------------------------------------------------ 3. the console killed


def test_03_killing_the_console_leaves_training_running_and_attach_takes_it_over(tmp_path, pool):
    run = make_run(tmp_path / "runs", nodes=2, max_steps=30)
    launch_then_kill_console(run, max_steps=30, step_s=0.2)
    with RunController.open(run, pool, purpose="attach") as ctrl:
        assert ctrl.reconcile() == "live"  # not marked failed while it trains
        outcome = ctrl.follow(interval=0.1)
        assert outcome.phase is Phase.DONE and outcome.progress["step"] == 30
        assert len(ctrl.run.read_state().attempts) == 1  # never launched twice


# ------------------------------------------------------------------ 4. SSH dropped, SSH hung


def test_04a_ssh_dropped_is_an_error_for_that_node_and_the_others_answer(
    sshd, sshd_hosts, frozen_node, tmp_path
):
    hosts = ["hung1", sshd_hosts[0].alias]
    with SshPool(combined_settings(sshd, frozen_node, tmp_path)) as pool:
        assert all(r.ok for r in pool.run_all(hosts, ["true"], timeout=20).values())
        serving = process_tree(frozen_node.server._proc.pid)  # the daemon this test started, and its children
        frozen_node.server.stop()
        for p in serving:  # the processes serving its connections too: the connection drops
            if alive(p):
                os.kill(p, signal.SIGKILL)
        t0 = time.monotonic()
        res = pool.run_all(hosts, ["echo", "up"], timeout=20)
        assert isinstance(res["hung1"], SshError) and "hung1" in str(res["hung1"])
        assert res[sshd_hosts[0].alias].stdout == "up\n" and time.monotonic() - t0 < 10


def test_04b_ssh_hung_is_unreachable_within_the_deadline_and_others_answer(
    sshd, sshd_hosts, frozen_node, tmp_path
):
    seconds = hung_node_report(sshd, sshd_hosts, frozen_node, tmp_path)
    print(f"hung node reported unreachable after {seconds:.2f} s")


# ------------------------------------------------------------------ 5. a stop beside a second run


def test_05_a_stop_ends_only_its_run_and_a_second_run_on_the_node_goes_on(launch_fake):
    ours = launch_fake(nodes=1, per_node=2, step_s=0.2)
    theirs = launch_fake(nodes=1, per_node=2, step_s=0.2)
    wait_for(lambda: step_of(ours) >= 2 and step_of(theirs) >= 2, 60, "both runs stepping")
    their_ranks = [rank_pid(theirs.run, r) for r in (0, 1)]
    record = ours.stop(grace_s=20)
    assert ours.state.phase is Phase.STOPPED and record.verified
    assert all(p == () for p in ours.processes().values())
    before = step_of(theirs)
    assert all(alive(p) for p in their_ranks)
    wait_for(lambda: step_of(theirs) > before, 30, "the other run to keep stepping")


# ------------------------------------------------------------------ 6. kill -9 during a save


@pytest.mark.slow
def test_06_kill_9_during_a_save_never_publishes_the_half_written_checkpoint(timeline):
    assert "step-4.tmp" in timeline["after_kill"] and "step-4" not in timeline["after_kill"]
    assert timeline["latest_after_kill"] == ("step-2", None)
    chosen, skipped = timeline["resolved_after_kill"]
    assert chosen.step == 2 and any(s.path.name == "step-4.tmp" for s in skipped)
    watch = {c.name: c for c in timeline["watch_after_kill"].items}
    assert watch["step-2"].state is CheckpointState.COMPLETE
    assert (
        watch["step-4.tmp"].state is CheckpointState.INCOMPLETE
        and "abandoned" in watch["step-4.tmp"].problems[0]
    )
    assert timeline["start_2"]["step"] == 2  # the resume took the last complete one


# ------------------------------------------------------------------ 7. ENOSPC during a save


@pytest.mark.slow
def test_07_disk_full_during_a_save_keeps_the_last_checkpoint(tmp_path, clip_dir):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    run = write_run(
        tmp_path / "run",
        base_config(
            clip_dir,
            topology={"gpus_per_node": 1},
            optim={"max_steps": 6},
            schedule={"checkpoint_every": 2, "val_every": 100, "keep_checkpoints": 2},
        ),
    )
    root = run / "checkpoints"
    root.mkdir()
    # one checkpoint of this model at world size 1 is ~216 MB: room for the first save, not a second
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=330m", "tmpfs", str(root)], check=True)
    try:
        launch = Launch(run, 1)
        rc = launch.wait(600)
        assert rc != 0, launch.tail()
        failed = [e for e in events(run, 0, "error")] + [
            e for e in events(run, 0, "checkpoint") if e.get("status") == "failed"
        ]
        assert failed and events(run, 0, "stop")[-1]["reason"] == "error", launch.tail()
        assert ckpt.read_latest(root) == ("step-2", None)
        assert ckpt.verify(root / "step-2", hashes=True).ok
        chosen, _ = ckpt.resolve_resume(root, "latest")
        assert chosen.step == 2
        assert not (root / "step-4").exists()  # nothing half-written was published
        # what the console makes of the rank's own words: the node and the path, not a bare traceback
        said = (
            failed[0]
            if failed[0].get("kind") == "error"
            else {**failed[0], "message": failed[0].get("message")}
        )
        failure = choose_failure([], {0: said}, 1, time.time())
        assert failure.reason.startswith("disk full on node 0 at ") and str(root) in failure.reason, (
            failure.reason
        )
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)


def _fill(fs: Path) -> Path:
    """Write a file until the filesystem under `fs` has not one page left."""
    filler = fs / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 4096):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError:
                pass
    return filler


@pytest.mark.timeout(180)
def test_07b_disk_full_under_the_console_stops_the_nodes_and_records_the_failure_once_space_allows(
    tmp_path, pool
):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    runs = tmp_path / "runs"
    runs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(runs)], check=True)
    ctrl = None
    try:
        run = make_run(runs, nodes=2)
        ctrl = RunController.open(run, pool, purpose="test")
        fake_commands(ctrl, 1, 1000, 0.2)
        ctrl.launch()
        wait_for(lambda: step_of(ctrl) >= 2, 60, "two steps")
        victim = rank_pid(run, 1)
        filler = _fill(runs)
        os.kill(victim, signal.SIGKILL)
        notes: list[str] = []
        outcome = ctrl.follow(
            on_update=lambda snap: notes.extend(snap.notes), interval=0.1
        )  # a crash here was the hole
        assert outcome.phase is Phase.FAILED
        assert all(p == () for p in ctrl.processes().values())  # the nodes were stopped all the same
        said = [n for n in notes if n.startswith("disk full on ")]
        assert len(said) == 1 and str(run.state_path) in said[0], notes  # said once, with the path
        assert run.read_state().phase is not Phase.FAILED  # nothing could be recorded yet
        filler.unlink()
        assert ctrl.flush_state()
        assert run.read_state().phase is Phase.FAILED and run.read_state().failure is not None
    finally:
        if ctrl is not None:
            ctrl.backend.kill(ctrl.run, ctrl.attempt)
            ctrl.close()
        subprocess.run(["umount", "-l", str(runs)], check=False)


# ------------------------------------------------------------------ 8. damaged shards


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x55
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_08a_a_truncated_shard_is_refused(timeline, tmp_path):
    d = shutil.copytree(timeline["spare"] / "step-2", tmp_path / "step-2")
    shard = d / "ds" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size // 2)
    st = ckpt.verify(d)
    assert not st.ok and "zero_pp_rank_0_mp_rank_00_optim_states.pt" in st.problems[0]
    with pytest.raises(ckpt.CheckpointError, match="bytes, manifest says"):
        ckpt.resolve_resume(tmp_path, str(d))


@pytest.mark.slow
def test_08b_a_same_size_corrupted_shard_is_refused_by_its_hash(timeline, tmp_path):
    d = shutil.copytree(timeline["spare"] / "step-2", tmp_path / "step-2")
    _flip(d / "ds" / "mp_rank_00_model_states.pt")
    assert ckpt.verify(d).ok is ckpt.verify(d, deep=False).ok  # sizes alone cannot see it
    st = ckpt.verify(d, hashes=True)
    assert not st.ok and "contents differ" in st.problems[0]
    chosen, skipped = ckpt.resolve_resume(tmp_path, "latest")
    assert chosen is None and any("contents differ" in s.problems[0] for s in skipped)


# ------------------------------------------------------------------ 9. garbage in latest


@pytest.mark.slow
@pytest.mark.parametrize(
    "garbage", [b"step-2; rm -rf /\n", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00\x01"], ids=["text", "binary"]
)
def test_09_garbage_in_latest_is_reported_and_the_checkpoints_decide(timeline, tmp_path, garbage):
    root = tmp_path / "checkpoints"
    shutil.copytree(timeline["spare"] / "step-2", root / "step-2")
    (root / "latest").write_bytes(garbage)
    summary = CheckpointWatcher(root).summary(RunActivity(live=False))
    assert [c.name for c in summary.items] == ["step-2"] and summary.items[
        0
    ].state is CheckpointState.COMPLETE
    assert any("latest" in p and "ignored" in p for p in summary.problems)
    chosen, skipped = ckpt.resolve_resume(root, "latest")
    assert chosen.step == 2 and "ignored" in skipped[-1].problems[0]


# ------------------------------------------------------------------ 10. retention


@pytest.mark.slow
def test_10a_retention_after_a_crash_during_a_save(timeline):
    # the resumed run re-saved step 4 over the dead .tmp and kept its source beside the newest two
    assert timeline["start_2"]["resumed_from"].endswith("step-2")
    after = timeline["after_resume"]
    assert "step-4.tmp" not in after and {"step-4", "step-6", "step-2"} <= set(after)


@pytest.mark.slow
def test_10b_retention_after_resume_from_an_older_checkpoint_keeps_the_lineage(timeline):
    root = timeline["root"]
    assert timeline["start_3"]["resumed_from"] == str(root / "step-4")
    assert [s.step for s in ckpt.scan(root).complete] == [5, 4]  # the new one and its source
    assert ckpt.read_latest(root) == ("step-5", None)
    moved = list((root / ckpt.ABANDONED).glob("*-at-step-4/step-6"))
    assert len(moved) == 1 and ckpt.verify(moved[0], hashes=True).ok  # the old timeline, kept aside
    assert ckpt.resolve_resume(root, "latest")[0].step == 5  # not the abandoned step-6


# ------------------------------------------------------------------ 11. malicious preset or hostfile


def test_11a_a_malicious_preset_is_refused_naming_the_key_and_file(tmp_path):
    marker = tmp_path / "PWNED"
    path = write_preset(tmp_path, {f"NCCL_DEBUG$(touch {marker})": "WARN"})
    with pytest.raises(ConfigError) as err:
        load_preset(str(path), user_dir=None)
    assert str(path) in str(err.value) and "POSIX name" in str(err.value)
    assert main(["render", "--preset", str(path), "--out", str(tmp_path / "out")]) != 0
    assert not marker.exists() and not (tmp_path / "out" / "sbatch.sh").exists()


def test_11b_a_malicious_hostfile_is_refused_naming_the_line(tmp_path, capsys):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("gpu01 slots=8\n-oProxyCommand=touch${IFS}/tmp/x slots=8\n")
    with pytest.raises(HostfileError, match=r"hostfile:2: host '-oProxyCommand"):
        parse_hostfile(hostfile.read_text(), str(hostfile))
    assert main(["detect", "--hosts", str(hostfile), "--json"]) != 0
    assert "hostfile:2" in capsys.readouterr().err


# ------------------------------------------------------------------ 12. host keys


def test_12a_an_unknown_host_key_is_refused_in_the_cli_and_nothing_runs(sshd, sshd_hosts, tmp_path, capsys):
    host = sshd_hosts[0].host
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyUnknownError) as err:
        connect(host, sshd.settings(known_hosts_path=str(empty)))
    assert "SHA256:" in str(err.value) and "taehv-console trust" in err.value.fix
    env = {**sshd.env(), "TAEHV_KNOWN_HOSTS": str(empty)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "taehv_console.cli",
            "detect",
            "--hosts",
            str(sshd.write_hostfile(tmp_path / "hosts", hosts=[host])),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert done.returncode != 0 and "host key" in (done.stdout + done.stderr).lower()
    assert empty.read_text() == ""  # never trusted behind the user's back


def test_12b_a_changed_host_key_is_refused_in_the_cli(sshd, sshd_hosts, tmp_path):
    host = sshd_hosts[1].host
    forged = paramiko.Ed25519Key.from_private_key_file(sshd.key_path)  # not the host's key
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[{host}]:{sshd.port} ssh-ed25519 {forged.get_base64()}\n")
    with pytest.raises(HostKeyChangedError, match="HOST KEY CHANGED"):
        connect(host, sshd.settings(known_hosts_path=str(kh)))
    assert main(["trust", host, "--known-hosts", str(kh), "--yes"]) == 1  # only with --replace
    assert forged.get_base64() in kh.read_text()


def test_12c_an_unknown_host_key_in_the_tui_is_shown_and_trusted_only_on_confirmation(
    sshd, tmp_path, monkeypatch
):
    import asyncio

    from taehv_console.ui.screens.detect import DetectScreen
    from tests.ui.conftest import sample_app

    known, unknown = sshd.addresses[0], sshd.addresses[1]
    kh = tmp_path / "known_hosts"
    kh.write_text(
        "".join(
            line + "\n"
            for line in Path(sshd.known_hosts).read_text().splitlines()
            if not line.startswith(f"[{unknown}]")
        )
    )
    for k, v in {**sshd.env(), "TAEHV_KNOWN_HOSTS": str(kh)}.items():
        monkeypatch.setenv(k, v)
    app = sample_app(
        "--hosts",
        str(sshd.write_hostfile(tmp_path / "hostfile", hosts=[known, unknown])),
        "--runs",
        str(tmp_path / "runs"),
    )

    async def until(pilot, predicate, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not predicate():
            await pilot.pause(0.1)
        assert predicate()

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await app.push_screen(DetectScreen())
            await until(pilot, lambda: app.wizard.topology is not None, 120)
            probes = {p.host: p for p in app.wizard.probes}
            assert probes[known].ok and not probes[unknown].ok and "trust" in probes[unknown].fix
            app.screen.query_one("#nodes").move_cursor(row=1)
            await pilot.press("T")
            await until(pilot, lambda: type(app.screen).__name__ == "ConfirmScreen", 30)
            assert "SHA256:" in str(app.screen.body)
            assert f"[{unknown}]" not in kh.read_text()  # shown, not yet trusted
            await pilot.press("n")
            await pilot.pause(0.5)
            assert f"[{unknown}]" not in kh.read_text()  # declined: still not trusted

    asyncio.run(go())


# ------------------------------------------------------------------ 13. a corrupt video


@pytest.mark.slow
def test_13_a_corrupt_video_is_skipped_reported_and_training_goes_on(timeline):
    skipped = [e for e in timeline["data_events"] if e["path"].endswith("zz_corrupt.mp4")]
    assert skipped and "corrupt" in skipped[0]["reason"]
    assert timeline["start_3"]["step"] == 4  # the run went on past it to its checkpoints


# ------------------------------------------------------------------ 14. benign NCCL noise


def test_14_benign_nccl_noise_raises_nothing():
    scanner = LogScanner()
    lines = (FIXTURES / "logs" / "benign_noise.log").read_text().splitlines()
    assert any("NCCL" in line for line in lines)
    assert scanner.feed("node-0.log", lines, now=5.0) + scanner.flush("node-0.log", now=5.0) == []


# ------------------------------------------------------------------ 15. 2x8 treated as 1x16


def test_15_two_nodes_of_eight_run_as_one_of_sixteen_is_an_error_before_launch():
    topo = hostfile_topology(("gpu01", 8), ("gpu02", 8))
    facts = {h: build_facts(h) for h in ("gpu01", "gpu02")}
    [f] = [
        f
        for f in pf.check_processes_vs_gpus(topo, facts, gpu_config(nodes=1, ppn=16))
        if f.id == "topology-mismatch"
    ]
    assert f.severity.name == "ERROR" and "invalid device ordinal" in f.message
    assert "--set topology.nodes=2 --set topology.gpus_per_node=8" in f.fix
