"""A preset, a --set or a hostfile is user input that ends up in shell scripts: names are validated
by the schema, every value is quoted, and running what was rendered never executes a value."""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from taehv_console.core.cluster.hosts import InvalidHostError
from taehv_console.core.plan.presets import load_preset
from taehv_console.core.plan.render import RenderOptions, export_lines, render_all, write_launch_files
from trainer.config import ConfigError

EVIL_VALUE = "x; touch {m}/PWNED_SEMI $(touch {m}/PWNED_SUBST) `touch {m}/PWNED_TICK` ' \" \\ ${{HOME}}"


def write_preset(tmp_path: Path, env: dict[str, str]) -> Path:
    lines = "\n".join(f"{_toml_str(k)} = {_toml_str(v)}" for k, v in env.items())
    path = tmp_path / "evil.toml"
    path.write_text(
        textwrap.dedent("""\
        [preset]
        base = "cpu-smoke"
        [distributed.nccl_env]
        """)
        + lines
        + "\n"
    )
    return path


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def test_a_key_with_shell_syntax_is_refused_naming_the_key_and_file(tmp_path):
    marker = tmp_path / "PWNED"
    path = write_preset(tmp_path, {f"NCCL_X$(touch {marker})": "1"})
    with pytest.raises(ConfigError) as info:
        load_preset(str(path), user_dir=None)
    text = str(info.value)
    assert str(path) in text and "distributed.nccl_env" in text
    assert f"NCCL_X$(touch {marker})" in text and "POSIX name" in text
    assert not marker.exists()


@pytest.mark.parametrize("key", ["1ABC", "A-B", "A B", "A=B", ""])
def test_other_non_posix_names_are_refused(tmp_path, key):
    with pytest.raises(ConfigError, match="POSIX name"):
        load_preset(str(write_preset(tmp_path, {key: "1"})), user_dir=None)


def test_a_key_through_set_is_validated_too(tmp_path):
    with pytest.raises(ConfigError, match="POSIX name") as info:
        load_preset("cpu-smoke", user_dir=None, overrides=['distributed.nccl_env.A;id="1"'])
    assert "--set" in str(info.value)


def test_a_value_with_metacharacters_is_quoted_and_never_executed(tmp_path):
    """Run the rendered sbatch.sh for real with bash (scontrol and srun replaced by two-line
    scripts that report the environment srun was given): the value arrives as text."""
    marks = tmp_path / "marks"
    marks.mkdir()
    value = EVIL_VALUE.format(m=marks)
    cfg = load_preset(str(write_preset(tmp_path, {"NCCL_EVIL": value})), user_dir=None).config
    run = tmp_path / "run"
    write_launch_files(cfg, run)
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "scontrol").write_text("#!/bin/sh\necho localhost\n")
    (shims / "srun").write_text(f"#!/bin/sh\nprintenv NCCL_EVIL > {tmp_path}/seen\n")
    for s in shims.iterdir():
        s.chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "localhost"}
    done = subprocess.run(
        ["bash", str(run / "sbatch.sh")], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert list(marks.iterdir()) == []  # nothing in the value ran
    assert (tmp_path / "seen").read_text() == value + "\n"
    # Kubernetes gets the value as a YAML string, unchanged
    job = list(yaml.safe_load_all((run / "k8s-job.yaml").read_text()))[1]
    envs = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert envs["NCCL_EVIL"] == value


def test_export_lines_refuse_a_hand_built_bad_name():
    assert export_lines({"A": "b c"}) == ["export A='b c'"]
    with pytest.raises(ValueError, match="POSIX name"):
        export_lines({"A$(id)": "1"})


@pytest.mark.parametrize("host", ["-oProxyCommand=touch_x", "gpu01;touch x", "gpu 01", "gpu01\nevil slots=8"])
def test_hosts_that_could_be_options_or_shell_are_refused_before_rendering(tmp_path, host):
    cfg = load_preset("16gpu-h100", user_dir=None).config
    with pytest.raises(InvalidHostError):
        render_all(cfg, RenderOptions(run_dir=str(tmp_path), hosts=("gpu00", host)))
    with pytest.raises(InvalidHostError):
        render_all(cfg, RenderOptions(run_dir=str(tmp_path), hosts=("gpu00", "gpu01"), main_process_ip=host))
