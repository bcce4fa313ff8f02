"""The run commands are offered by `taehv-console --help` without importing torch & co, and the
node tool a console runs over SSH on every poll starts without them too (it runs many times a
minute on every node)."""

from __future__ import annotations

import pytest

from tests.core.test_cli_startup import loaded_after


@pytest.mark.parametrize("command", ["status", "stop", "resume", "attach"])
def test_run_command_help_imports_nothing_heavy(command):
    assert loaded_after(command, "--help") == []


def test_node_tool_imports_nothing_heavy():
    import json
    import subprocess
    import sys

    code = (
        "import json, sys; from taehv_console.core.run import node; node.tree_command("
        "node.build_parser().parse_args(['pids', '--pgid', '999999'])); "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'torch', 'deepspeed', 'accelerate', 'paramiko', 'pydantic', 'rich'})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == []
