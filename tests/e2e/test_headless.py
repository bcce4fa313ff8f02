"""`taehv-console --no-tui` as a container or a laptop runs it: the exit code is the answer.

- success: no GPU and no --data -> cpu-smoke as shipped on generated clips, the README's first
  command, trained to the end (exit 0), and it visibly learns: validation PSNR gains 3 dB over the
  run (from the untrained model's, validated at step 0) and ends above a flat output;
- preflight error: a data directory that does not exist -> exit 3, nothing started;
- usage error -> exit 2;
- SIGTERM: two platform pods (WORLD_SIZE=2, RANK=0/1, as PAI-DLC/Kubeflow set them) each run
  `--no-tui --preset RUN/run.toml` like the rendered Kubernetes Job; SIGTERM to pod 0's console
  stops the whole run gracefully (the ranks agree to stop together), both pods exit 4 (stopped)
  with a checkpoint at the step they stopped at.
"""

from __future__ import annotations

import json
import os
import signal
import socket

import pytest

from taehv_console.headless import ExitCode
from tests.e2e.consoles import SMALL_RUN, THREADS, Console, events, free_port, is_step, run_cli, run_state
from tests.trainer.runs import flat_grey_psnr
from trainer.config import load_config

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _no_platform_env() -> dict:
    # the test process may itself run under a launcher; the console must see a plain machine
    drop = {
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "JOB_COMPLETION_INDEX",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
    }
    return {k: v for k, v in os.environ.items() if k not in drop}


@pytest.mark.timeout(900)
def test_no_gpu_and_no_data_trains_cpu_smoke_on_generated_clips_to_the_end_and_learns(tmp_path):
    # nothing set but one thread per rank (THREADS: what the launcher gives each of 2 ranks anyway)
    console = Console(
        "--no-tui", "--runs", tmp_path / "runs", "--json", *THREADS, env=_no_platform_env(), cwd=tmp_path
    )
    rc = console.wait(840)
    assert rc == ExitCode.DONE, console.tail()
    result = console.result()
    assert result["phase"] == "done" and result["exit_name"] == "done"
    run = tmp_path / "runs" / result["run"]
    assert (run / "final" / "taehv.safetensors").is_file()
    notes = [o["message"] for o in console.lines if o.get("kind") == "note"]
    assert "family taehv (HunyuanVideo 1), exported as taehv.safetensors + .pth" in notes, notes
    preflight = next(o for o in console.lines if o.get("kind") == "preflight")
    assert "cpu-smoke" in preflight["config"] and "generated clips" in preflight["config"]
    clips = tmp_path / "runs" / "generated-clips"
    assert any(clips.rglob("*.mp4"))
    assert str(clips) in (run / "run.toml").read_text()  # the run trained on them
    # each validation's samples are named once, newest last (the final step's), with paths that exist
    told = [o for o in console.lines if o.get("kind") == "samples"]
    steps = [o["step"] for o in told]
    assert steps == sorted(set(steps)) and steps[-1] == 40, steps
    for o in told:
        assert o["dir"] == str(run / "samples" / f"step-{o['step']}") and o["clips"], o
        assert all(os.path.isfile(c["png"]) and os.path.isfile(c["video"]) for c in o["clips"]), o

    # it learns: the validation curve of the preset as shipped (the untrained baseline first)
    vals = events(run, 0, "val")
    assert [v["step"] for v in vals] == [0, 10, 20, 30, 40]
    best = run / "best" / "info.json"
    assert not best.is_file() or json.loads(best.read_text())["step"] > 0
    flat = flat_grey_psnr(load_config(run / "run.toml"))
    curve = [round(v["psnr"], 2) for v in vals]
    # Measured: [8.79, 14.79, 14.76, 15.19, 15.12] against 14.84 for flat grey.
    assert vals[-1]["psnr"] >= vals[0]["psnr"] + 3.0, f"validation PSNR {curve}"
    assert vals[-1]["psnr"] > flat, f"validation PSNR {curve} vs {flat:.2f} dB for a flat grey output"


def test_a_one_node_run_whose_port_is_taken_says_so_and_trains_on_a_free_one(tmp_path):
    # --master-port names a port another process holds: preflight says so (no error), and
    # accelerate launches the one machine standalone on a free port, as preflight promised
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", port))
        holder.listen(1)
        console = Console(
            *("--no-tui", "--runs", tmp_path / "runs", "--json", "--master-port", port, *SMALL_RUN),
            *("--set", "optim.max_steps=2", "--set", "optim.warmup_steps=0"),
            env=_no_platform_env(),
            cwd=tmp_path,
        )
        rc = console.wait(300)
    assert rc == ExitCode.DONE, console.tail()
    preflight = next(o for o in console.lines if o.get("kind") == "preflight")
    taken = [f for f in preflight["findings"] if f["id"] == "master-port-taken"]
    assert [f["severity"] for f in taken] == ["info"] and str(port) in taken[0]["message"], preflight
    assert not [f for f in preflight["findings"] if f["severity"] == "error"], preflight
    run = tmp_path / "runs" / console.result()["run"]
    assert (run / "final" / "taehv.safetensors").is_file()
    assert events(run, 0, "step")[-1]["step"] == 2
    launcher = "\n".join(p.read_text(errors="replace") for p in (run / "logs").glob("*.log"))
    assert f"Port `{port}` is already in use" in launcher  # accelerate's own fallback, not luck


def test_a_missing_data_directory_fails_preflight_and_starts_nothing(tmp_path):
    r = run_cli(
        "--no-tui",
        "--runs",
        tmp_path / "runs",
        "--data",
        tmp_path / "no-such-videos",
        "--json",
        env=_no_platform_env(),
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == ExitCode.PREFLIGHT_FAILED, r.stdout[-2000:] + r.stderr[-2000:]
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    findings = next(o for o in lines if o.get("kind") == "preflight")["findings"]
    assert any(f["id"] == "data-missing" and f["severity"] == "error" for f in findings)
    assert not (tmp_path / "runs").exists() or not any(
        p.name[:2] == "20" for p in (tmp_path / "runs").iterdir()
    )


def test_a_usage_error_exits_2(tmp_path):
    r = run_cli("--no-tui", "--env", "not-an-assignment", env=_no_platform_env(), cwd=tmp_path)
    assert r.returncode == ExitCode.USAGE and "KEY=VALUE" in r.stderr


def test_exit_codes_are_the_documented_enum():
    assert [(c.name, c.value) for c in ExitCode] == [
        ("DONE", 0),
        ("TRAINING_FAILED", 1),
        ("USAGE", 2),
        ("PREFLIGHT_FAILED", 3),
        ("STOPPED", 4),
        ("BUSY", 5),
        ("FAILED_FINAL", 6),
        ("CRASHED", 70),
        ("INTERRUPTED", 130),
        ("OUTPUT_CLOSED", 141),
    ]
    r = run_cli("--help")
    assert (
        "0 done, 1 training_failed, 2 usage, 3 preflight_failed, 4 stopped, 5 busy, 6 failed_final, 70 crashed, "
        "130 interrupted, 141 output_closed" in " ".join(r.stdout.split())
    )


def test_sigterm_to_a_platform_pod_stops_the_whole_run_with_a_checkpoint(tmp_path):
    from trainer import checkpoint as ckpt
    from trainer.synthetic import make_synthetic

    clips = tmp_path / "clips"
    make_synthetic(clips, clips=8, frames=12, height=64, width=64, seed=3)
    run = tmp_path / "runs" / "pod-run"
    # what an operator does before submitting the Job: render the run onto shared storage
    r = run_cli(
        "render",
        "--preset",
        "cpu-smoke",
        "--nodes",
        "2",
        "--gpus-per-node",
        "1",
        "--out",
        run,
        "--set",
        f"data.source={clips}",
        "--set",
        "optim.max_steps=200",
        "--set",
        "schedule.val_every=1000",
        "--set",
        "schedule.checkpoint_every=1000",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    port = free_port()
    pods = []
    for rank in (0, 1):
        env = {
            **_no_platform_env(),
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        pods.append(
            Console(
                "--no-tui",
                "--preset",
                run / "run.toml",
                "--runs",
                tmp_path / "runs",
                "--json",
                *SMALL_RUN,
                "--env",
                "TAEHV_FAULTS=delay:0:*:1",
                env=env,
                cwd=tmp_path,
            )
        )
    pods[0].wait_for(lambda o: is_step(o, 2), 400, "step 2 on pod 0")
    pods[0].signal(signal.SIGTERM)  # what Kubernetes sends a pod that is deleted
    rcs = [p.wait(300) for p in pods]
    assert rcs == [ExitCode.STOPPED, ExitCode.STOPPED], [p.tail() for p in pods]
    stops = [events(run, r, "stop")[-1] for r in (0, 1)]
    assert all(s["reason"] == "signal" for s in stops) and stops[0]["step"] == stops[1]["step"]
    assert ckpt.scan(run / "checkpoints").newest.step == stops[0]["step"]
    state = run_state(run)  # written by pod 0, which controls node 0 and reports on both
    assert state["backend"] == "platform" and state["phase"] == "stopped"
    assert state["stop"]["checkpoint_step"] == stops[0]["step"] and state["stop"]["verified"]
    assert {e["node"] for e in (events(run, r, "start")[-1] for r in (0, 1))}  # both ranks started
    statuses = [(run / "logs" / f"node-{i}.status.json").read_text() for i in (0, 1)]
    assert '"node": 1' in statuses[1]  # pod 1 launched machine rank 1 itself
    assert pods[1].result()["phase"] == "stopped"
