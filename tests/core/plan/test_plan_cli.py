"""`presets`, `plan` and `render` from the command line: JSON that parses, files that appear, and
errors that are one clear line with a non-zero exit, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from taehv_console.cli import main


@pytest.fixture(autouse=True)
def no_user_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TAEHV_CONSOLE_PRESETS", str(tmp_path / "none"))


def run_json(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out)


def test_presets_json(capsys):
    code, data = run_json(capsys, "presets", "--json")
    assert code == 0 and data["errors"] == []
    by_name = {p["name"]: p for p in data["presets"]}
    assert by_name["48gpu-h100"]["nodes"] == 6 and by_name["48gpu-h100"]["gpus_per_node"] == 8
    assert by_name["48gpu-h100"]["effective_batch"] == 240 and by_name["cpu-smoke"]["device"] == "cpu"


def test_presets_table_and_a_broken_user_preset(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TAEHV_CONSOLE_PRESETS", str(tmp_path))
    (tmp_path / "typo.toml").write_text("[optim]\nlr = 'fast'\n")
    code = main(["presets"])
    out, err = capsys.readouterr()
    assert code == 1  # the listing is shown, and the broken file makes the exit status say so
    assert "64gpu-h100" in out and "8 x 8" in out
    assert "typo.toml" in err and "optim.lr" in err


def test_plan_comparison_json(capsys):
    code, data = run_json(capsys, "plan", "--json", "--bandwidth", "25Gbit")
    assert code == 0 and data["baseline"] == "8gpu-h100"
    names = [p["name"] for p in data["plans"]]
    assert "cpu-smoke" not in names and {"8gpu-h100", "64gpu-h100"} <= set(names)
    base = next(p for p in data["plans"] if p["name"] == "8gpu-h100")
    # 100k steps x 128 clips at 33 clips/s per H100 (this trainer, measured), NVLink: 13.5 h
    assert base["speedup_vs_baseline"] == 1.0 and round(base["time"]["hours_to_max_steps"], 1) == 13.5


def test_plan_derived_topology_json(capsys):
    code, data = run_json(
        capsys,
        "plan",
        "--preset",
        "8gpu-h100",
        "--nodes",
        "4",
        "--gpus-per-node",
        "8",
        "--bandwidth",
        "25Gbit",
        "--json",
    )
    assert code == 0 and data["derived"] is True
    plan = data["plan"]
    assert plan["topology"]["world_size"] == 32 and plan["batch"]["effective"] == 192
    assert plan["communication"]["link"] == "inter-node 25Gbit"
    assert plan["memory"]["fits"] is True
    assert any(r["key"] == "optim.lr" and r["reason"].startswith("LR 0.00015") for r in data["reasons"])


def test_plan_json_carries_the_whole_resolved_config_with_a_matched_presets_timeout(capsys):
    # auto picks the published 16gpu-h100 for 2 x 8 H100: nothing is derived, and its timeout
    # (the published 7200 s for 2 nodes) is in the output with the planner's explanation
    code, data = run_json(
        capsys, "plan", "--preset", "auto", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "H100", "--json"
    )
    assert code == 0 and data["derived"] is False and data["preset"] == "16gpu-h100"
    cfg = data["config"]
    assert set(cfg) >= {"run", "topology", "model", "data", "optim", "schedule", "deepspeed", "distributed"}
    assert cfg["distributed"]["collective_timeout_s"] == 7200
    assert cfg["optim"]["max_steps"] == 100_000 and cfg["topology"]["nodes"] == 2
    assert data["plan"]["collective_timeout"]["seconds"] == 7200
    assert "as published for 2 node(s)" in data["plan"]["collective_timeout"]["why"]


def test_a_derived_config_waits_minutes_not_hours_and_says_why(capsys):
    code, data = run_json(
        capsys, "plan", "--preset", "auto", "--nodes", "3", "--gpus-per-node", "8", "--gpu", "H100", "--json"
    )
    assert code == 0 and data["derived"] is True
    assert data["config"]["distributed"]["collective_timeout_s"] == 600
    why = data["plan"]["collective_timeout"]["why"]
    assert why.startswith("600 s (10 min)") and "stalled rank within ~30 s" in why and "7200 s" in why
    main(["plan", "--preset", "auto", "--nodes", "3", "--gpus-per-node", "8", "--gpu", "H100"])
    assert "timeout       600 s (10 min)" in capsys.readouterr().out


def test_plan_auto_and_human_output(capsys):
    code = main(["plan", "--preset", "auto", "--nodes", "2", "--gpus-per-node", "8", "--gpu", "H100"])
    out = capsys.readouterr().out
    assert code == 0
    assert "preset 16gpu-h100 matches 2 x 8 H100" in out
    assert "ZeRO-3 cannot help" in out  # the published ZeRO-3 preset, with the planner's note
    # and what ZeRO-3 costs it, per step and in HBM, against ZeRO-2 (16 GPUs, bf16: 3 x 15/16 x 22.6 MB)
    assert "deepspeed     ZeRO-3, buckets of 3e+06 elements (4 per gradient), overlap_comm on: 63.6 MB" in out
    assert (
        "ZeRO-3 costs this 11.3M-parameter model 63.6 MB per GPU per step against 42.4 MB under ZeRO-2" in out
    )


def test_plan_shows_how_deepspeed_was_sized_for_a_derived_config(capsys):
    code, data = run_json(
        capsys, "plan", "--preset", "auto", "--nodes", "1", "--gpus-per-node", "4", "--gpu", "H100", "--json"
    )
    assert code == 0 and data["derived"] is True
    why = {r["key"]: r["reason"] for r in data["reasons"]}
    assert data["config"]["deepspeed"]["zero_stage"] == 1 and why["deepspeed.zero_stage"].startswith(
        "ZeRO-1: "
    )
    assert data["config"]["deepspeed"]["overlap_comm"] is False and why["deepspeed.overlap_comm"].startswith(
        "off: "
    )
    assert data["plan"]["deepspeed"][0].startswith("ZeRO-1, buckets of 2e+07 elements (1 per gradient)")
    main(["plan", "--preset", "auto", "--nodes", "1", "--gpus-per-node", "4", "--gpu", "H100"])
    out = capsys.readouterr().out
    assert "deepspeed.zero_stage" in out and "deepspeed.overlap_comm" in out  # the reasons table
    assert "deepspeed     ZeRO-1, buckets of 2e+07 elements (1 per gradient), overlap_comm off" in out


def test_plan_memory_misfit_exits_non_zero(capsys):
    code, data = run_json(
        capsys, "plan", "--preset", "8gpu-h100", "--set", "optim.batch_per_gpu=64", "--json"
    )
    assert code == 1 and data["plan"]["memory"]["fits"] is False
    assert "does not fit" in data["plan"]["memory"]["notes"][0]


def test_render_writes_files(capsys, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two nodes\n10.0.0.1 slots=8\n10.0.0.2 slots=8\n")
    out = tmp_path / "run"
    code, data = run_json(
        capsys, "render", "--preset", "16gpu-h100", "--hosts", str(hostfile), "--out", str(out), "--json"
    )
    assert code == 0 and data["derived"] is False and data["placeholder_hosts"] is False
    node1 = yaml.safe_load((out / "accelerate-node-1.yaml").read_text())
    assert node1["machine_rank"] == 1 and node1["main_process_ip"] == "10.0.0.1"
    assert (out / "hostfile").read_text().splitlines()[-1] == "10.0.0.2 slots=8"


def test_render_derives_from_the_hostfile_topology(capsys, tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=4\nb slots=4\nc slots=4\n")
    code, data = run_json(
        capsys,
        "render",
        "--preset",
        "8gpu-h100",
        "--hosts",
        str(hostfile),
        "--out",
        str(tmp_path / "r"),
        "--json",
    )
    assert code == 0 and data["derived"] is True and data["preset"] == "8gpu-h100@3x4"
    assert yaml.safe_load((tmp_path / "r" / "accelerate-node-2.yaml").read_text())["num_processes"] == 12


@pytest.mark.parametrize(
    "argv, message",
    [
        (["plan", "--preset", "no-such"], "no preset named 'no-such'"),
        (["plan", "--nodes", "2"], "give both --nodes and --gpus-per-node"),
        (["plan", "--preset", "8gpu-h100", "--bandwidth", "fast"], "bandwidth 'fast'"),
        (
            ["render", "--preset", "8gpu-h100", "--out", "OUT", "--hosts", "BADHOSTS"],
            "starts with '-'",
        ),
        (
            ["plan", "--preset", "8gpu-h100", "--set", "data.frames=13"],
            "data.frames: must be a multiple of 4",
        ),
        (
            ["render", "--preset", "8gpu-h100", "--out", "OUT", "--set", "optim.lrr=1"],
            "optim.lrr: unknown key",
        ),
        (
            ["render", "--preset", "8gpu-h100", "--out", "OUT", "--hosts", "MISSING"],
            "no such hostfile",
        ),
    ],
)
def test_user_errors_are_one_message_and_exit_2(argv, message, tmp_path):
    bad = tmp_path / "bad-hosts"
    bad.write_text("-oProxyCommand=touch slots=8\n")  # an option disguised as a host
    argv = [
        a.replace("OUT", str(tmp_path / "out"))
        .replace("MISSING", str(tmp_path / "nope"))
        .replace("BADHOSTS", str(bad))
        for a in argv
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "taehv_console.cli", *argv],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert message in proc.stderr and proc.stderr.startswith(f"taehv-console {argv[0]}: ")
    assert "Traceback" not in proc.stderr
