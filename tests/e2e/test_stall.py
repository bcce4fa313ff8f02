"""A stalled rank is named by every front end long before the collective timeout: a real 2-rank
CPU run under `--no-tui --json`, rank 1 SIGSTOPped. Within max(3 heartbeat intervals, 30 s) the
headless stream names rank 1 as stalled (and prints its forensics), and `status --json` names it
and carries its py-spy stack. Then SIGCONT, a stop, and nothing of the run is left.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from taehv_console.headless import ExitCode
from tests.e2e.consoles import SMALL_RUN, Console, events, is_step, run_cli, run_state, tree_on
from tests.e2e.test_headless import _no_platform_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _heartbeat(run, rank: int) -> dict:
    return json.loads((run / "heartbeat" / f"rank-{rank}.json").read_text())


def _record(run, dest) -> None:
    """The run directory's small files as they are during the stall, and when: a recorded run the
    TUI and headless agreement test renders (checkpoints, logs and TensorBoard left out)."""
    import shutil

    dest.mkdir(parents=True)
    for name in ("run.toml", "state.json"):
        shutil.copy2(run / name, dest / name)
    for folder in ("events", "heartbeat", "forensics"):
        if (run / folder).is_dir():
            shutil.copytree(run / folder, dest / folder)
    (dest / "recorded_at").write_text(f"{time.time():.3f}\n")


def test_sigstopped_rank_is_named_by_headless_and_status_with_its_stack(tmp_path):
    from taehv_console.core.cluster.ssh import LocalRunner

    env = _no_platform_env()
    console = Console(
        "--no-tui",
        "--runs",
        tmp_path / "runs",
        "--json",
        "--set",
        "optim.max_steps=100000",
        "--set",
        "schedule.val_every=100000",
        "--set",
        "schedule.checkpoint_every=100000",
        # the stall is named and cleared here; ending it with a restart is tested elsewhere
        "--set",
        "recovery.stall_restart_after_s=3600",
        "--grace",
        "60",
        *SMALL_RUN,
        env=env,
        cwd=tmp_path,
    )
    figures: dict[str, float] = {}
    try:
        phase = console.wait_for(lambda o: o.get("kind") == "phase", 300, "the run to start")
        run = tmp_path / "runs" / phase["run"]
        console.wait_for(lambda o: is_step(o, 3), 300, "three steps")
        steps = [e["step_time_s"] for e in events(run, 0, "step")][-3:]
        interval = sorted(steps)[1]
        bound = max(3 * interval, 30.0)
        pid1 = _heartbeat(run, 1)["pid"]
        os.kill(pid1, signal.SIGSTOP)
        t0 = time.time()
        try:
            # the headless stream names rank 1, and rank 0 is not blamed
            stall = console.wait_for(lambda o: o.get("kind") == "stall", bound + 15, "a stall line")
            figures["headless_s"] = stall["_seen"] - t0
            assert stall["rank"] == 1 and stall["pid"] == pid1, stall
            assert 0 in stall["waiting"], stall
            assert figures["headless_s"] <= bound, (figures, bound)
            assert not any(o.get("kind") == "stall" and o.get("rank") == 0 for o in console.lines)

            # status --json, a separate process reading the run directory, says the same
            deadline, info = time.time() + bound + 30, {}
            while time.time() < deadline:
                r = run_cli("status", run, "--json", env=env, cwd=tmp_path, timeout=120)
                assert r.returncode == 0, r.stderr
                info = json.loads(r.stdout)
                if [s["rank"] for s in info.get("stalled", [])] == [1]:
                    figures.setdefault("status_s", time.time() - t0)
                    f1 = [f for f in info.get("forensics", []) if f["rank"] == 1]
                    if f1 and f1[-1]["frames"]:
                        break
                time.sleep(1.0)
            assert "status_s" in figures, info
            _record(run, tmp_path / "recorded")  # what tests/fixtures/runs/sigstop was made from
            assert figures["status_s"] <= bound + 10, figures  # + one status process start-up
            rank1 = next(r for r in info["ranks"] if r["rank"] == 1)
            assert rank1["state"] == "stalled" and rank1["pid"] == pid1
            rank0 = next(r for r in info["ranks"] if r["rank"] == 0)
            assert rank0["state"] != "stalled" and rank0["blocked_by"] == 1
            f1 = [f for f in info["forensics"] if f["rank"] == 1][-1]
            assert f1["pid"] == pid1 and f1["frames"], f1
            # a real py-spy stack of the trainer: its frames name the training code
            assert any("train" in fr for fr in f1["frames"]), f1["frames"]
            assert (run / f1["dump_path"]).is_file() or os.path.isfile(f1["dump_path"]), f1
            # and the headless stream printed the same report
            rep = console.wait_for(
                lambda o: o.get("kind") == "forensics" and o.get("rank") == 1, 60, "the forensics report"
            )
            assert rep["frames"][:3] == f1["frames"][:3]
        finally:
            os.kill(pid1, signal.SIGCONT)
        console.wait_for(
            lambda o: o.get("kind") == "recovered" and o.get("rank") == 1, 120, "rank 1 recovered"
        )
        console.signal(signal.SIGTERM)
        rc = console.wait(240)
        assert rc == ExitCode.STOPPED, console.tail()
        state = run_state(run)
        assert state["phase"] == "stopped" and state["stop"]["verified"], state["stop"]
        runner = LocalRunner("localhost")
        for n in state["attempts"][-1]["nodes"]:
            assert tree_on(runner, n["pgid"], node=n, run_id=state["run_id"]) == []
        for r in (0, 1):
            pid = _heartbeat(run, r)["pid"]
            assert (
                not os.path.exists(f"/proc/{pid}")
                or open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
            )
    finally:
        if console.proc.poll() is None:
            console.kill()
    print(
        f"\nSIGSTOP -> named: headless {figures.get('headless_s', -1):.1f} s, status --json "
        f"{figures.get('status_s', -1):.1f} s (bound {bound:.0f} s, step {interval:.2f} s)"
    )
