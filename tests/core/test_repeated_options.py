"""A key given twice on one command line (issue 44): --set and --env keep the last value, as a
dict does, and say so, naming every value and the one used; --data beside a --set data.source
says which one wins. Before, the first value vanished without a word."""

from __future__ import annotations

import json

from taehv_console import cli
from taehv_console.core.flow.options import repeated_keys


def test_a_set_key_given_twice_names_both_values_and_the_one_used():
    said = repeated_keys(["optim.lr=1e-4", "optim.max_steps=5", " optim . lr =2e-4"], [])
    assert said == ("--set optim.lr is given 2 times ('1e-4', then '2e-4'): the last, '2e-4', is used",)


def test_an_env_key_given_three_times_names_all_three():
    said = repeated_keys([], ["NCCL_DEBUG=INFO", "A=1", "NCCL_DEBUG=WARN", "NCCL_DEBUG="])
    assert said == (
        "--env NCCL_DEBUG is given 3 times ('INFO', then 'WARN', then ''): the last, '', is used",
    )


def test_data_over_a_set_data_source_says_data_wins():
    said = repeated_keys(["data.source=/videos/a"], [], "/videos/b")
    assert said == ("--set data.source ('/videos/a') is overridden by --data: '/videos/b' is used",)


def test_nothing_repeated_nothing_said():
    assert repeated_keys(["optim.lr=1e-4", "data.source=/a", "no-equals"], ["A=1", "B=1"], None) == ()


def test_the_command_line_warns_and_uses_the_last_value(capsys):
    # before and after the command's name: settle collects both, in that order
    code = cli.main(
        ["--set", "optim.lr=1e-4", "plan", "--preset", "cpu-smoke", "--set", "optim.lr=3e-4", "--json"]
    )
    out, err = capsys.readouterr()
    assert code == 0
    assert (
        "taehv-console plan: warning: --set optim.lr is given 2 times ('1e-4', then '3e-4'): "
        "the last, '3e-4', is used" in err
    )
    assert json.loads(out)["config"]["optim"]["lr"] == 3e-4  # the one said, on a stdout that stays JSON


def test_the_tui_gets_the_warnings_in_its_options():
    options, _theme = cli.console_options(["--env", "A=1", "--env", "A=2"])
    assert options.warnings == ("--env A is given 2 times ('1', then '2'): the last, '2', is used",)
    assert options.env == {"A": "2"}
