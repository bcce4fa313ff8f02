"""A user's preset must name the sections whose defaults nobody chose (issue 44): without
[topology] it was planned as one H100, without [optim] it trained at LR 1e-4 for 1,000 steps, and
neither was said. A base preset may supply them; --set changes values on top, as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from taehv_console.cli import main
from taehv_console.core.plan.presets import load_preset
from taehv_console.exit_codes import ExitCode
from trainer.config import ConfigError


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("body", "missing"),
    [
        ("[optim]\nlr = 2e-4\nmax_steps = 10\n", ["[topology]"]),
        ("[topology]\nnodes = 1\ngpus_per_node = 8\n", ["[optim]"]),
        ('[preset]\ndescription = "mine"\n', ["[topology]", "[optim]"]),
    ],
)
def test_a_user_preset_without_a_required_section_is_named(tmp_path, body, missing):
    path = _write(tmp_path / "mine.toml", body)
    with pytest.raises(ConfigError) as info:
        load_preset(path, user_dir=None)
    text = str(info.value)
    assert text.startswith(f"{path}: no ") and all(m in text for m in missing), text
    assert 'base = "8gpu-h100"' in text  # the way out


def test_the_cli_says_it_in_one_line_with_the_usage_code(tmp_path, capsys):
    path = _write(tmp_path / "mine.toml", "[optim]\nlr = 2e-4\n")
    assert main(["plan", "--preset", path]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "no [topology] table" in err and "Traceback" not in err


def test_a_base_supplies_the_sections_and_set_still_overrides(tmp_path):
    path = _write(tmp_path / "mine.toml", '[preset]\nbase = "cpu-smoke"\n[data]\nsource = "/videos"\n')
    p = load_preset(path, user_dir=None, overrides=["optim.max_steps=7"])
    assert p.config.optim.max_steps == 7 and p.config.data.source == "/videos"
    assert load_preset("cpu-smoke", user_dir=None, overrides=["optim.lr=3e-4"]).config.optim.lr == 3e-4


def test_a_malformed_key_is_still_named_before_a_missing_section(tmp_path):
    path = _write(tmp_path / "bad.toml", "[optim]\nbatch = 3\n")
    with pytest.raises(ConfigError, match="optim.batch"):
        load_preset(path, user_dir=None)
