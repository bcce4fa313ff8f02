"""benchmarks/gpu_session.sh runs only on a lent GPU, in one call of a few minutes' budget: a typo
in a part's name or its shares would cost that session. Checked here without running it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_session.sh"


def test_every_default_part_is_defined_and_the_shares_fill_the_budget():
    text = SCRIPT.read_text()
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)  # the shell parses it
    default = re.search(r"\$\{STEPS:-([^}]*)\}", text)
    assert default, "no default STEPS"
    parts = dict(step.split(":") for step in default[1].split())
    defined = set(re.findall(r"^(\w+)\(\) \{", text, re.MULTILINE))
    assert set(parts) <= defined, set(parts) - defined
    assert sum(int(share) for share in parts.values()) == 100, parts
    # the standing order's parts: the throughput grid, the trainer, NVDEC decoding, NVML and NCCL
    assert {"eager", "trainer", "decoders", "forensics"} <= set(parts)


def _throughput_calls(text: str, script: str = "gpu_throughput.py") -> dict[str, list[list[str]]]:
    """Each part's calls of a benchmark (gpu_throughput.py: through `tp` too, or by path), as argument
    lists, with the shell's expansions replaced by plain values."""
    import shlex

    text = text.replace("\\\n", " ")
    calls: dict[str, list[list[str]]] = {}
    # the parts: functions whose body starts on the next line (tp, left, share are one-liners)
    for name, body in re.findall(r"^(\w+)\(\) \{(?: #[^\n]*)?\n(.*?)^\}", text, re.MULTILINE | re.DOTALL):
        for line in body.splitlines():
            line = re.sub(r'"\$\([^)]*\)\)"|"\$\(share "\$\w+"\)"|"\$s"', "60", line.split(" #")[0])
            words = shlex.split(line.replace('"$OUT"', "/tmp/out").replace("$PY", "python3"))
            if words[:1] == ["tp"] and script == "gpu_throughput.py":
                calls.setdefault(name, []).append(words[1:])
            elif f"benchmarks/{script}" in words:
                calls.setdefault(name, []).append(words[words.index(f"benchmarks/{script}") + 1 :])
    return calls


def _load(name: str):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(f"{name}_for_session", SCRIPT.parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_every_call_of_the_throughput_benchmark_parses():
    """A flag the benchmark does not know would end that part at once on the GPU."""
    bench = _load("gpu_throughput")
    calls = _throughput_calls(SCRIPT.read_text())
    assert {"eager", "trainer", "compiled", "inputs", "autotune", "zero3"} <= set(calls), calls
    for part, argv_list in calls.items():
        for argv in argv_list:
            args = bench.parse(argv)  # argparse exits (SystemExit 2) on an unknown flag or value
            assert args.sections, (part, argv)
    compiled = bench.parse(calls["compiled"][0])
    assert compiled.step == ["recon", "distill"] and compiled.modes == ["compile"]
    eager3, compiled3 = (bench.parse(argv) for argv in calls["zero3"])
    assert eager3.zero == compiled3.zero == "3" and not eager3.trainer_compile and compiled3.trainer_compile


def test_the_compile_cache_part_parses():
    calls = _throughput_calls(SCRIPT.read_text(), "compile_cache.py")
    assert list(calls) == ["compilecache"], calls
    (argv,) = calls["compilecache"]
    args = _load("compile_cache").parse(argv)  # SystemExit 2 on an unknown flag
    assert args.device == "cuda" and args.out is not None and args.timeout_s == 60, args
