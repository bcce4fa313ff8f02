"""A net that stays (issue 44): property-based tests that draw values for every `--set` key of the
run config's schema (trainer/config.py) and for the options of the commands that launch nothing,
run each command line in-process through `taehv_console.cli.main`, and assert that no traceback
reaches the user and the exit code is one the command's `--help` table lists, never CRASHED (70:
a bug). Fixed seed (derandomize) and bounded examples: the same inputs every run, a few seconds."""

from __future__ import annotations

import contextlib
import importlib
import io
import types
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from taehv_console.cli import COMMANDS, main
from taehv_console.exit_codes import ExitCode
from trainer.config import TrainConfig

FUZZ = settings(
    derandomize=True,  # the same examples every run: a failure here is a failure everywhere
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def leaves(model: type[BaseModel], prefix: str = "") -> list[tuple[str, object]]:
    """Every settable key of the schema (dotted) with its annotation."""
    out: list[tuple[str, object]] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += leaves(ann, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", ann))
    return out


KEYS = leaves(TrainConfig)

# values as a user types them: numbers at and past every edge, words, lists, quoting, nothing
NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 65536, 70000]),
    st.floats(allow_nan=True, allow_infinity=True),
).map(str)
WORDS = st.sampled_from(
    ["", "true", "false", "nan", "inf", "-inf", "1e309", "None", "[]", "[1, 2]", "{}", '""', "'x'",
     "auto", "cuda", "cpu", "bf16", "cosine", "$(touch /tmp/x)", "../../etc", "é", "\x00", "a=b"]
)  # fmt: skip
TEXT = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=12)


def value_for(ann: object) -> st.SearchStrategy[str]:
    """Text for a key: mostly of its own type, edges included, and anything else besides."""
    own: list[st.SearchStrategy[str]] = [NUMBERS, WORDS, TEXT]
    args = typing.get_args(ann)
    if typing.get_origin(ann) is typing.Literal:
        own.append(st.sampled_from([repr(a) if isinstance(a, str) else str(a) for a in args]))
    elif typing.get_origin(ann) is tuple:
        own.append(
            st.lists(st.one_of(NUMBERS, st.sampled_from(["true", "false"])), max_size=4).map(
                lambda xs: "[" + ", ".join(xs) + "]"
            )
        )
    elif ann is bool:
        own.append(st.sampled_from(["true", "false", "1", "0", "yes"]))
    return st.one_of(*own)


SET_ITEMS = st.sampled_from(KEYS).flatmap(lambda kv: value_for(kv[1]).map(lambda v: f"{kv[0]}={v}"))


def run_cli(argv: list[str]) -> tuple[int, str]:
    """main(argv) in this process: (exit code, stderr). argparse's own exit is its code."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: 2 for a usage error
            code = exc.code if isinstance(exc.code, int) else ExitCode.USAGE
    return int(code), err.getvalue()


def documented(command: str) -> set[int]:
    return {int(c) for c in importlib.import_module(COMMANDS[command][0]).EXIT_CODES}


def check(command: str, argv: list[str]) -> None:
    code, err = run_cli(argv)
    assert "Traceback" not in err, (argv, err)
    assert code != ExitCode.CRASHED, (argv, err)  # a crash log was written: a bug
    assert code in documented(command), (argv, code, err)


@pytest.fixture(autouse=True)
def quiet_machine(tmp_path, monkeypatch):
    """No platform variables (this machine alone), crash logs in tmp_path, cwd in tmp_path."""
    for var in (
        "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "JOB_COMPLETION_INDEX",
        "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID",
    ):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TAEHV_CRASH_DIR", str(tmp_path / "crashes"))
    monkeypatch.chdir(tmp_path)


def test_the_schema_walk_finds_every_section():
    sections = {k.split(".")[0] for k, _ann in KEYS}
    assert sections == set(TrainConfig.model_fields), sections
    assert len(KEYS) > 60


@FUZZ
@given(
    items=st.lists(SET_ITEMS, min_size=1, max_size=3),
    preset=st.sampled_from(["cpu-smoke", "8gpu-h100", "auto"]),
)
def test_plan_takes_any_set_value_without_a_traceback(items, preset):
    argv = ["plan", "--preset", preset, "--json"]
    if preset == "auto":
        argv += ["--nodes", "2", "--gpus-per-node", "8", "--gpu", "H100"]
    for item in items:
        argv += ["--set", item]
    check("plan", argv)


@FUZZ
@given(item=SET_ITEMS)
def test_render_takes_any_set_value_without_a_traceback(item, tmp_path_factory):
    out = tmp_path_factory.mktemp("render")
    check("render", ["render", "--preset", "cpu-smoke", "--out", str(out), "--set", item, "--json"])


OPTION_TEXT = st.one_of(NUMBERS, WORDS, TEXT)
PLAN_OPTIONS = [
    "--nodes", "--gpus-per-node", "--gpu", "--gpu-memory-gb", "--bandwidth", "--throughput",
    "--efficiency", "--target-comm", "--price", "--failure-rate",
]  # fmt: skip


@FUZZ
@given(
    options=st.dictionaries(st.sampled_from(PLAN_OPTIONS), OPTION_TEXT, min_size=1, max_size=4),
    preset=st.sampled_from([None, "cpu-smoke", "8gpu-h100", "auto"]),
)
def test_plan_takes_any_option_value_without_a_traceback(options, preset):
    argv = ["plan"] + (["--preset", preset] if preset else [])
    for flag, value in options.items():
        argv += [f"{flag}={value}"]  # one token: a value may start with '-'
    check("plan", argv)


def paths(root: Path) -> st.SearchStrategy[str]:
    """A runs or data path of every awkward kind: missing, a file, empty, a folder of junk, with
    spaces and non-ASCII letters, a path below a file."""
    (root / "a file").write_text("x")
    (root / "empty").mkdir(exist_ok=True)
    junk = root / "junk ünï"
    (junk / "not-a-run").mkdir(parents=True, exist_ok=True)
    (junk / "half").mkdir(exist_ok=True)
    (junk / "half" / "run.toml").write_text("[run\n")  # a run whose run.toml is not TOML
    (junk / "stray.json").write_text("{")
    return st.sampled_from(
        [str(root / "missing"), str(root / "a file"), str(root / "a file" / "below"), str(root / "empty"),
         str(junk), "", "."]
    )  # fmt: skip


@settings(FUZZ, max_examples=40)
@given(data=st.data())
def test_status_and_listings_take_any_runs_path(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    runs = data.draw(paths(root))
    command = data.draw(st.sampled_from(["status", "stop", "attach", "resume"]))
    run = data.draw(st.one_of(st.none(), st.sampled_from(["half", "nope", "2026", "../a file"]), TEXT))
    argv = [command, "--runs", runs, "--no-check"] if command == "status" else [command, "--runs", runs]
    if run is not None:
        argv += ["--", run] if run.startswith("-") else [run]
    check(command, argv)


@settings(FUZZ, max_examples=30)
@given(data=st.data())
def test_detect_and_preflight_take_any_paths_and_ssh_options(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("paths")
    command = data.draw(st.sampled_from(["detect", "preflight"]))
    argv = [command, "--runs", data.draw(paths(root))]
    if data.draw(st.booleans()):
        argv += ["--data", data.draw(paths(root))]
    for flag in data.draw(
        st.sets(st.sampled_from(["--parallel", "--connect-timeout", "--master-port"]), max_size=2)
    ):
        if flag == "--master-port" and command == "detect":
            continue
        argv += [f"{flag}={data.draw(OPTION_TEXT)}"]
    if command == "preflight":
        argv += ["--json"]
    check(command, argv)


@settings(FUZZ, max_examples=30)
@given(data=st.data())
def test_eval_takes_any_arguments_without_a_traceback(data, tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    garbage = root / "garbage.safetensors"
    garbage.write_bytes(b"\x00not safetensors")
    target = data.draw(
        st.sampled_from([str(garbage), str(root / "missing.safetensors"), "no-such-run", str(root)])
    )
    argv = ["eval", target, "--data", data.draw(paths(root)), "--runs", str(root)]
    for flag in data.draw(
        st.sets(st.sampled_from(["--clips", "--frames", "--size", "--device"]), max_size=2)
    ):
        argv += [f"{flag}={data.draw(OPTION_TEXT)}"]
    check("eval", argv)


def test_the_fuzzers_would_notice_a_crash(monkeypatch):
    from taehv_console.commands import plan

    monkeypatch.setattr(plan, "run", lambda args: {}["missing"])
    with pytest.raises(AssertionError):
        check("plan", ["plan"])
    assert isinstance(plan, types.ModuleType)
