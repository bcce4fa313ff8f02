"""Imports sit at module top, except in the places listed here, each with why start-up or a bare
node needs it to be lazy (issue 12). A new function-level import fails this test until it is
listed with a reason, and a listed one that is gone must leave the list, so the list in
taehv_console/cli.py's docstring stays the whole truth."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (file, imported module) -> why it is imported inside a function
LAZY: dict[tuple[str, str], str] = {
    ("taehv_console/cli.py", "taehv_console.ui.app"): "Textual, only on the TUI path",
    ("taehv_console/cli.py", "taehv_console"): "headless (the whole flow), only on the --no-tui path",
    ("taehv_console/core/cluster/bandwidth.py", "torch"): "torch only in the measuring processes",
    ("taehv_console/core/cluster/bandwidth.py", "torch.distributed"): "torch only in the measuring processes",
    (
        "taehv_console/core/cluster/nodecheck.py",
        "trainer.teacher",
    ): "the node helper's other checks need no diffusers",
    ("taehv_console/core/cluster/nodecheck.py", "trainer.latent_cache"): "torch, only for the cache check",
    (
        "taehv_console/core/cluster/nodecheck.py",
        "trainer.bench_data",
    ): "torch and PyAV, only for the loader check",
    (
        "taehv_console/core/cluster/nodecheck.py",
        "trainer.config",
    ): "pydantic models, only for the loader check",
    ("taehv_console/core/cluster/nodecheck.py", "trainer.data"): "torch and PyAV, only for the loader check",
    ("taehv_console/core/cluster/nodecheck.py", "av"): "PyAV, only for the video scan",
    ("taehv_console/core/cluster/probe.py", "pynvml"): "a bare node may lack nvidia-ml-py: the probe says so",
    ("taehv_console/core/cluster/probe.py", "torch"): "the NCCL version, only where torch is installed",
    (
        "taehv_console/core/cluster/ssh/config.py",
        "paramiko",
    ): "~0.2 s, only where ~/.ssh/config is read or a connection opened",
    (
        "taehv_console/core/cluster/ssh/hostkeys.py",
        "paramiko",
    ): "~0.2 s, only where a host key is handled",
    (
        "taehv_console/core/cluster/ssh/runners.py",
        "paramiko",
    ): "~0.2 s, only where a connection is made",
    ("taehv_console/commands/eval.py", "trainer.evaluate"): "torch and PyAV, only once eval runs",
    ("taehv_console/commands/eval.py", "trainer.eval_report"): "torch and PyAV, only once eval runs",
    ("taehv_console/commands/eval.py", "trainer.synthetic"): "PyAV, only once eval runs (--size)",
    ("taehv_console/core/flow/config.py", "trainer.synthetic"): "PyAV and numpy, only when clips are made",
    ("taehv_console/core/watch/nvml.py", "pynvml"): "a bare node may lack nvidia-ml-py: the agent says so",
    (
        "taehv_console/core/watch/tbscalars.py",
        "tensorboard.backend.event_processing.event_file_loader",
    ): "TensorBoard's reader, only when a logdir is followed",
    (
        "taehv_console/core/watch/tbscalars.py",
        "tensorboard.util",
    ): "TensorBoard's reader, only when a logdir is followed",
    ("taehv_console/ui/screens/preflight.py", "taehv_console.core.flow.config"): "the TUI's first frame",
    ("taehv_console/ui/screens/preflight.py", "taehv_console.core.flow.preflight"): "the TUI's first frame",
    ("taehv_console/ui/screens/preset.py", "taehv_console.core.plan.planner"): "the TUI's first frame",
    ("taehv_console/ui/screens/preset.py", "taehv_console.core.flow.config"): "the TUI's first frame",
    ("taehv_console/ui/screens/preset.py", "taehv_console.core.flow.launch"): "the TUI's first frame",
    ("taehv_console/ui/screens/preset.py", "taehv_console.core.plan.presets"): "the TUI's first frame",
    ("taehv_console/ui/screens/review.py", "taehv_console.core.plan.planner"): "the TUI's first frame",
}


def function_level_imports(root: Path, package: str = "taehv_console") -> set[tuple[str, str]]:
    found = set()
    for path in sorted((root / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for n in ast.walk(node):
                    if isinstance(n, ast.ImportFrom):
                        found.add((path.relative_to(root).as_posix(), "." * n.level + (n.module or "")))
                    elif isinstance(n, ast.Import):
                        found |= {(path.relative_to(root).as_posix(), a.name) for a in n.names}
    return found


def test_imports_inside_functions_are_only_the_listed_ones():
    found = function_level_imports(ROOT)
    unlisted = sorted(found - LAZY.keys())
    assert not unlisted, (
        f"imports inside functions: move them to the module's top, or list them with a reason: {unlisted}"
    )
    gone = sorted(LAZY.keys() - found)
    assert not gone, f"listed as lazy but no longer imported inside a function: {gone}"


def test_the_scan_sees_a_new_function_level_import(tmp_path):
    pkg = tmp_path / "taehv_console" / "core"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text(
        "import os\n\n\ndef f():\n    import json\n    from .y import z\n    return json, z\n"
    )
    assert function_level_imports(tmp_path) == {
        ("taehv_console/core/x.py", "json"),
        ("taehv_console/core/x.py", ".y"),
    }


def test_the_cli_docstring_names_every_file_with_a_lazy_import():
    from taehv_console import cli

    for file in {f for f, _ in LAZY} - {"taehv_console/cli.py"}:  # cli.py's own are "here"
        assert Path(file).name in cli.__doc__, file
