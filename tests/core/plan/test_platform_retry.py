"""The platforms retry by the console's exit codes: the rendered Kubernetes Job retries what another
try may get past and fails at once on a code that says a retry would repeat the failure; the
rendered sbatch script is requeued on a node failure or preemption and goes on from the newest
checkpoint the job wrote. The Job is checked as the API server would (the podFailurePolicy rules'
shape and validation) and its rules are evaluated the way the Job controller does; the sbatch
script's requeue branch runs in bash with stand-ins for srun and scontrol."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from taehv_console.core.plan.presets import load_preset
from taehv_console.core.plan.render import (
    K8S_RETRIES_PER_NODE,
    RenderOptions,
    render_all,
)
from taehv_console.exit_codes import ExitCode

# what exit_codes.py says a platform must not retry: usage, preflight, a final failure, a crash
FINAL = {ExitCode.USAGE, ExitCode.PREFLIGHT_FAILED, ExitCode.FAILED_FINAL, ExitCode.CRASHED}
ACTIONS = {"FailJob", "FailIndex", "Ignore", "Count"}  # the Job API's PodFailurePolicyRule actions


def preset(name):
    return load_preset(name, user_dir=None).config


def job_of(cfg, run_dir="/shared/runs/r1"):
    docs = list(yaml.safe_load_all(render_all(cfg, RenderOptions(run_dir=run_dir))["k8s-job.yaml"]))
    (job,) = [d for d in docs if d["kind"] == "Job"]
    return job


def decide(job: dict, exit_code: int, conditions: tuple[str, ...] = ()) -> str:
    """The Job controller's verdict on one failed pod of this Job (one container, exit_code):
    the first rule that matches decides; none matching means Count (against backoffLimit)."""
    container = job["spec"]["template"]["spec"]["containers"][0]["name"]
    for rule in job["spec"]["podFailurePolicy"]["rules"]:
        if "onExitCodes" in rule:
            req = rule["onExitCodes"]
            if req.get("containerName", container) != container or exit_code == 0:
                continue  # another container's codes; a container that succeeded is never checked
            if (exit_code in req["values"]) == (req["operator"] == "In"):
                return rule["action"]
        elif any(
            p["type"] in conditions and p.get("status", "True") == "True" for p in rule["onPodConditions"]
        ):
            return rule["action"]
    return "Count"


@pytest.mark.parametrize("name", ["16gpu-h100", "64gpu-h100", "cpu-smoke"])
def test_the_job_passes_the_apis_pod_failure_policy_validation(name):
    cfg = preset(name)
    job = job_of(cfg)
    spec = job["spec"]
    pod = spec["template"]["spec"]
    # podFailurePolicy cannot be combined with OnFailure: failed pods are replaced by the Job
    assert pod["restartPolicy"] == "Never"
    rules = spec["podFailurePolicy"]["rules"]
    assert 0 < len(rules) <= 20
    containers = {c["name"] for c in pod["containers"]} | {c["name"] for c in pod.get("initContainers", [])}
    for rule in rules:
        assert rule["action"] in ACTIONS
        assert ("onExitCodes" in rule) != ("onPodConditions" in rule)  # one of them, never both
        if "onExitCodes" in rule:
            req = rule["onExitCodes"]
            assert req["operator"] in ("In", "NotIn")
            values = req["values"]
            assert values and len(values) <= 255
            assert values == sorted(set(values))  # ordered, no duplicates
            assert all(isinstance(v, int) and not isinstance(v, bool) for v in values)
            assert req["operator"] != "In" or 0 not in values
            assert req["containerName"] in containers
        else:
            assert 0 < len(rule["onPodConditions"]) <= 20
            assert all(
                p["type"] and p.get("status", "True") in ("True", "False", "Unknown")
                for p in rule["onPodConditions"]
            )
        # FailIndex is only for a Job with backoffLimitPerIndex; this one fails as a whole
        assert rule["action"] != "FailIndex" or "backoffLimitPerIndex" in spec


@pytest.mark.parametrize("name", ["16gpu-h100", "cpu-smoke"])
def test_a_final_exit_code_fails_the_job_and_a_retryable_one_counts(name):
    cfg = preset(name)
    job = job_of(cfg)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    (fail,) = [r for r in job["spec"]["podFailurePolicy"]["rules"] if r["action"] == "FailJob"]
    # exactly the final codes, on the container that runs the console
    assert fail["onExitCodes"] == {
        "containerName": container["name"],
        "operator": "In",
        "values": sorted(int(c) for c in FINAL),
    }
    assert container["command"][:2] == ["taehv-console", "--no-tui"]
    for code in ExitCode:
        if code is ExitCode.DONE:
            continue  # a pod that succeeded is no failure
        assert decide(job, int(code)) == ("FailJob" if code in FINAL else "Count"), code.name
    assert decide(job, 137) == "Count"  # SIGKILL (the OOM killer, say): another try may get past it


def test_a_disrupted_pod_is_replaced_without_counting_whatever_it_exited_with():
    job = job_of(preset("16gpu-h100"))
    for code in (ExitCode.TRAINING_FAILED, ExitCode.STOPPED, ExitCode.FAILED_FINAL, 137):
        assert decide(job, int(code), conditions=("DisruptionTarget",)) == "Ignore"


@pytest.mark.parametrize("name", ["16gpu-h100", "64gpu-h100", "cpu-smoke"])
def test_the_retry_budget_is_kubernetes_default_per_node(name):
    cfg = preset(name)
    spec = job_of(cfg)["spec"]
    # one node's failure fails every pod of the run, and each counts: 6 tries of the whole run
    assert K8S_RETRIES_PER_NODE == 6
    assert spec["backoffLimit"] == 6 * cfg.topology.nodes
    assert spec["completionMode"] == "Indexed" and spec["completions"] == cfg.topology.nodes
    if cfg.topology.nodes == 1:
        assert spec["backoffLimit"] == 6  # Kubernetes' own default


def test_a_pod_gets_the_stop_grace_before_sigkill():
    cfg = preset("16gpu-h100")
    pod = job_of(cfg)["spec"]["template"]["spec"]
    # Kubernetes' default is 30 s: the console would be killed while the ranks write the checkpoint
    assert pod["terminationGracePeriodSeconds"] > cfg.schedule.stop_grace_s
    longer = cfg.model_copy(update={"schedule": cfg.schedule.model_copy(update={"stop_grace_s": 900})})
    assert job_of(longer)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 900


# ------------------------------------------------------------------------------------------ sbatch


def sbatch_text(tmp_path: Path, name: str = "cpu-smoke") -> str:
    return render_all(preset(name), RenderOptions(run_dir=str(tmp_path / "run")))["sbatch.sh"]


def test_sbatch_asks_to_be_requeued_and_keeps_its_output(tmp_path):
    text = sbatch_text(tmp_path, "16gpu-h100")
    lines = text.splitlines()
    # sbatch reads #SBATCH lines only up to the first command
    first_command = next(i for i, l in enumerate(lines) if l.strip() and not l.startswith("#"))
    directives = [l for l in lines[:first_command] if l.startswith("#SBATCH ")]
    assert "#SBATCH --requeue" in directives and "#SBATCH --open-mode=append" in directives
    assert not any(l.startswith("#SBATCH") for l in lines[first_command:])
    # a node lost must end the allocation, or SLURM does not requeue the job
    assert "--no-kill" not in " ".join(directives) and "--no-requeue" not in text
    # the script says how a final failure ends the job, by the console's codes
    for code in FINAL:
        assert f"{int(code)} {code.name.lower()}" in text
    assert "RequeueExit" in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)


def run_sbatch(tmp_path: Path, env: dict[str, str], preflight_fails: bool = False) -> tuple[int, str, str]:
    """Run the rendered script as SLURM would start it, with srun and scontrol stand-ins: srun
    writes its command line to a file (and fails the preflight step when asked). Returns the exit
    status, the training step's command line ('' when it did not run) and stderr."""
    script = tmp_path / "sbatch.sh"
    script.write_text(sbatch_text(tmp_path))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "srun.log"
    log.unlink(missing_ok=True)
    (bin_dir / "srun").write_text(
        '#!/bin/bash\nprintf "%s\\n" "$*" >> "$SRUN_LOG"\n'
        + ('case "$*" in *"cli preflight"*) exit 1;; esac\n' if preflight_fails else "")
    )
    (bin_dir / "scontrol").write_text("#!/bin/bash\necho node-a\n")
    for f in ("srun", "scontrol"):
        (bin_dir / f).chmod(0o755)
    full = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SRUN_LOG": str(log),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node-a",
        **env,
    }
    res = subprocess.run(["bash", str(script)], env=full, capture_output=True, text=True, timeout=60)
    steps = log.read_text().splitlines() if log.exists() else []
    train = [s for s in steps if "-m accelerate.commands.launch" in s]
    return res.returncode, train[-1] if train else "", res.stderr


def resume_args(train: str) -> list[str]:
    return train.split(" --run ", 1)[1].split()[1:]  # what follows --run <dir>


def complete_checkpoint(run: Path, name: str, mtime: float) -> None:
    d = run / "checkpoints" / name
    d.mkdir(parents=True)
    (d / "COMPLETE").write_text(name.split("-")[1].split(".")[0] + "\n")
    os.utime(d / "COMPLETE", (mtime, mtime))


def test_a_requeued_job_goes_on_from_the_checkpoint_it_wrote(tmp_path):
    run = tmp_path / "run"
    submitted = {"TAEHV_RESUME": str(run / "checkpoints" / "step-100"), "TAEHV_WEIGHTS_ONLY": "1"}
    # first start: as submitted, and it notes when it started
    code, train, _ = run_sbatch(tmp_path, submitted)
    assert code == 0 and resume_args(train) == ["--resume", submitted["TAEHV_RESUME"], "--weights-only"]
    started = run / "logs" / "slurm-4242.started"
    assert started.is_file()
    t0 = started.stat().st_mtime

    # requeued before this job saved anything (the source checkpoint is older): as submitted again
    complete_checkpoint(run, "step-100", t0 - 600)
    complete_checkpoint(run, "step-300.tmp", t0 + 60)  # an unfinished save is no checkpoint
    code, train, err = run_sbatch(tmp_path, {**submitted, "SLURM_RESTART_COUNT": "1"})
    assert code == 0 and resume_args(train) == ["--resume", submitted["TAEHV_RESUME"], "--weights-only"]
    assert "requeued (restart 1)" in err
    assert started.stat().st_mtime == t0  # the first start's time is kept

    # requeued after this job wrote a checkpoint: from the newest, with its optimizer state
    complete_checkpoint(run, "step-200", t0 + 30)
    code, train, err = run_sbatch(tmp_path, {**submitted, "SLURM_RESTART_COUNT": "2"})
    assert code == 0 and resume_args(train) == ["--resume", "latest"]
    assert "--resume latest" in err


def test_a_fresh_start_requeued_with_a_checkpoint_resumes_latest(tmp_path):
    run = tmp_path / "run"
    code, train, _ = run_sbatch(tmp_path, {})
    assert code == 0 and resume_args(train) == []
    t0 = (run / "logs" / "slurm-4242.started").stat().st_mtime
    code, train, _ = run_sbatch(tmp_path, {"SLURM_RESTART_COUNT": "1"})
    assert code == 0 and resume_args(train) == []  # nothing saved yet: a fresh start again
    complete_checkpoint(run, "step-50", t0 + 10)
    code, train, _ = run_sbatch(tmp_path, {"SLURM_RESTART_COUNT": "2"})
    assert code == 0 and resume_args(train) == ["--resume", "latest"]


def test_a_failed_preflight_ends_the_job_with_the_consoles_code(tmp_path):
    code, train, err = run_sbatch(tmp_path, {}, preflight_fails=True)
    assert code == ExitCode.PREFLIGHT_FAILED and train == ""
    assert "training was not started" in err
