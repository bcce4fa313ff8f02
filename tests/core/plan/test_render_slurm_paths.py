"""The SLURM files for a run directory with awkward letters in its path (issue 44): a space,
non-ASCII letters, `#`, quotes and `%` reach sbatch's own parser of `#SBATCH` lines and srun's
--output patterns intact; a path SLURM cannot take is refused by name; a preset name cannot turn
the batch script's comment into a command. The real sbatch reads the same lines in
tests/slurm/test_slurm_backends.py."""

from __future__ import annotations

import shlex

import pytest

from taehv_console.cli import main
from taehv_console.core.plan.presets import load_preset
from taehv_console.core.plan.render import (
    RenderOptions,
    render_sbatch,
    sbatch_directive_value,
    slurm_filename,
)
from taehv_console.core.run.backends import NodeCommand, SbatchBackend
from taehv_console.core.run.rundir import create_run_dir
from taehv_console.core.values import InputError
from taehv_console.exit_codes import ExitCode

AWKWARD = ["my runs/ünï cödé", "runs #2/a", 'it\'s "here"', "50% done/%j", "tab\there"]


def sbatch_argument(line: str) -> str:
    """The first argument of an #SBATCH line's text as sbatch reads it (src/sbatch/opt.c,
    _get_argument): whitespace ends it unless quoted; '...' and "..." group and the quotes go; a
    backslash keeps the next character, inside quotes too; an unquoted `#` ends the line."""
    out: list[str] = []
    quote = ""
    escape = False
    i = 0
    while i < len(line) and line[i].isspace():
        i += 1
    for c in line[i:]:
        if escape:
            out.append(c)
            escape = False
        elif c == "\\":
            escape = True
        elif quote:
            if c == quote:
                quote = ""
            else:
                out.append(c)
        elif c in "\"'":
            quote = c
        elif c.isspace() or c == "#":
            break
        else:
            out.append(c)
    return "".join(out)


def slurm_expand(pattern: str, job: str = "42", node: str = "0") -> str:
    """SLURM's output file patterns, the ones the console writes: %j, %n and %%."""
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "%" and i + 1 < len(pattern):
            out.append({"j": job, "n": node, "%": "%"}[pattern[i + 1]])
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def _script(run_dir: str, **overrides: str) -> str:
    sets = [f"{k}={v}" for k, v in overrides.items()]
    cfg = load_preset("cpu-smoke", user_dir=None, overrides=sets).config
    return render_sbatch(cfg, RenderOptions(run_dir=run_dir))


@pytest.mark.parametrize("name", AWKWARD)
def test_the_output_directive_reaches_sbatch_as_the_path(tmp_path, name):
    run_dir = str(tmp_path / name / "20260101-000000-cpu-smoke")
    script = _script(run_dir)
    (line,) = [ln for ln in script.splitlines() if ln.startswith("#SBATCH --output=")]
    value = sbatch_argument(line.removeprefix("#SBATCH "))
    assert value.startswith("--output=")
    assert slurm_expand(value.removeprefix("--output=")) == f"{run_dir}/logs/slurm-42.out"


@pytest.mark.parametrize("name", AWKWARD)
def test_every_srun_output_in_the_script_expands_to_the_node_log(tmp_path, name):
    run_dir = str(tmp_path / name / "run")
    script = _script(run_dir)
    outputs = [
        arg.removeprefix("--output=")
        for ln in script.splitlines()
        if "srun " in ln
        for arg in shlex.split(ln.rstrip("\\").replace("if ! ", ""))
        if arg.startswith("--output=")
    ]
    assert len(outputs) == 2  # the preflight step and the training step
    assert {slurm_expand(o, node="1") for o in outputs} == {f"{run_dir}/logs/node-1.log"}


def test_a_path_slurm_cannot_take_is_refused_by_name():
    with pytest.raises(InputError, match="line break"):
        sbatch_directive_value("/runs/a\nb", "run directory")
    with pytest.raises(InputError, match="backslash"):
        slurm_filename("/runs/a\\b")
    assert slurm_filename("/runs/100%") == "/runs/100%%"


def test_a_run_in_a_path_slurm_cannot_take_is_refused_by_the_sbatch_backend_only(tmp_path):
    out = tmp_path / "a\\b"
    assert main(["render", "--preset", "cpu-smoke", "--out", str(out)]) == ExitCode.DONE
    assert (out / "run.toml").is_file()  # the local and ssh backends need no SLURM file
    run = create_run_dir(out, "cpu-smoke")
    (run.path / "sbatch.sh").write_text((out / "sbatch.sh").read_text())
    cmd = NodeCommand(
        0, "n1", ("accelerate",), {}, str(run.node_log(0)), str(run.node_status_path(0)), str(run.path)
    )
    started = SbatchBackend(sbatch="/bin/false-never-run").start(run, [cmd], 1)
    assert "cannot be submitted to SLURM" in started.errors[-1] and "backslash" in started.errors[-1]


def test_a_line_break_in_the_preset_name_stays_in_the_comment(tmp_path):
    marker = tmp_path / "PWNED"
    script = _script(str(tmp_path / "run"), **{"run.preset": f"x\ntouch {marker}"})
    assert not any(ln.startswith("touch") for ln in script.splitlines())
    assert f"# x?touch {marker}:" in script
