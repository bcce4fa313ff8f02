"""Bad input named where it enters, and what would fail later named by preflight (issue 44): a runs
path that is a file or cannot be written, a notify command that cannot run, an unreachable node 0."""

from __future__ import annotations

import json
import os
import stat

import pytest

from taehv_console.cli import main
from taehv_console.core.cluster.nodecall import SshError
from taehv_console.core.cluster.preflight.software import check_notify
from taehv_console.core.cluster.ssh.errors import SshConnectError
from taehv_console.core.flow.preflight import free_port
from taehv_console.core.models import NodeSpec, Topology, TopologySource
from taehv_console.core.run.rundir import RunsDirError, create_run_dir, runs_dir_problem
from taehv_console.exit_codes import ExitCode

PLATFORM_VARS = (
    "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "JOB_COMPLETION_INDEX",
    "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_JOB_ID",
)  # fmt: skip


@pytest.fixture
def bare(tmp_path, monkeypatch):
    """No platform variables, crash logs kept in tmp_path/crashes (none expected)."""
    for var in PLATFORM_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TAEHV_CRASH_DIR", str(tmp_path / "crashes"))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    assert not (tmp_path / "crashes").exists(), "a crash log was written"


def test_a_runs_path_that_is_a_file_or_under_one_is_named(tmp_path):
    f = tmp_path / "runs-file"
    f.write_text("")
    assert "is a file, not a directory" in (runs_dir_problem(f) or "")
    assert "is a file, not a directory" in (runs_dir_problem(f / "sub" / "deeper") or "")
    assert runs_dir_problem(tmp_path / "new" / "runs") is None  # made when the run starts
    with pytest.raises(RunsDirError, match="is a file"):
        create_run_dir(f, "cpu-smoke")


def test_a_runs_directory_that_cannot_be_written_is_named(tmp_path, monkeypatch):
    # root ignores permission bits: stand in for a read-only mount through os.access
    ro = tmp_path / "ro"
    ro.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(ro) else real(p, mode))
    assert "cannot be written" in (runs_dir_problem(ro) or "")
    if os.geteuid() != 0:  # a real refusal, where permission bits bind
        ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
        try:
            with pytest.raises(RunsDirError, match="cannot be written"):
                create_run_dir(ro, "cpu-smoke")
        finally:
            ro.chmod(stat.S_IRWXU)


def test_no_tui_with_runs_naming_a_file_exits_2_before_writing(bare, capsys):
    f = bare / "runs-file"
    f.write_text("")
    assert main(["--no-tui", "--runs", str(f)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "is a file, not a directory" in err and "Traceback" not in err


def test_preflight_and_detect_say_a_runs_file_is_not_a_directory(bare, capsys):
    f = bare / "runs-file"
    f.write_text("")
    assert main(["preflight", "--runs", str(f), "--json"]) == ExitCode.PREFLIGHT_FAILED
    report = json.loads(capsys.readouterr().out)
    assert any(x["id"] == "runs-not-a-directory" and x["severity"] == "error" for x in report["findings"])
    assert main(["detect", "--runs", str(f)]) == ExitCode.DONE
    assert "not a directory" in capsys.readouterr().out


def test_a_notify_command_that_cannot_run_is_a_preflight_error(tmp_path):
    script = tmp_path / "notify.sh"
    script.write_text("#!/bin/sh\ncat >/dev/null\n")
    assert check_notify("") == []
    assert check_notify("sh -c true") == []
    (missing,) = check_notify(str(tmp_path / "nope") + " --to ops")
    assert missing.id == "notify-command-unusable" and "does not exist" in missing.message
    (not_exec,) = check_notify(str(script))
    assert "not an executable file" in not_exec.message
    script.chmod(0o755)
    assert check_notify(str(script)) == []
    (not_found,) = check_notify("no-such-notifier-44", which=lambda _p: None)
    assert "is not on PATH" in not_found.message
    (quote,) = check_notify("notify 'unclosed")
    assert quote.severity.value == "error"


def test_preflight_names_a_notify_command_that_does_not_exist(bare, capsys):
    argv = ["preflight", "--runs", str(bare / "runs"), "--set", "notify.command=/no/such/notifier", "--json"]
    assert main(argv) == ExitCode.PREFLIGHT_FAILED
    report = json.loads(capsys.readouterr().out)
    assert any(x["id"] == "notify-command-unusable" for x in report["findings"])


class _Unreachable:
    """A pool whose node 0 refuses the connection (SshConnectError), as a host refusing port 22 or
    not resolving does."""

    def runner(self, host):
        raise SshConnectError(host, f"cannot connect to {host}:22: Connection refused")


def test_free_port_keeps_the_port_when_node_0_cannot_be_reached():
    topology = Topology(
        source=TopologySource.HOSTFILE,
        node_count=2,
        nodes=(NodeSpec("node-a", 0, 1), NodeSpec("node-b", 1, 1)),
        master_addr="node-a",
        master_port=29511,
    )
    assert issubclass(SshConnectError, SshError)
    assert free_port(topology, _Unreachable()) == 29511  # type: ignore[arg-type]


def test_a_warm_up_as_long_as_the_run_is_a_warning():
    from taehv_console.core.cluster.preflight.software import check_schedule
    from trainer.config import OptimSection

    assert check_schedule(OptimSection(warmup_steps=10, max_steps=100)) == []
    (f,) = check_schedule(OptimSection(warmup_steps=100, max_steps=40))
    assert f.id == "warmup-exceeds-max-steps" and f.severity.value == "warning"
    assert "optim.warmup_steps=4" in f.fix
