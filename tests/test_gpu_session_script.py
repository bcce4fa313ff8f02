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


def _throughput_calls(text: str) -> dict[str, list[list[str]]]:
    """Each part's calls of gpu_throughput.py (through `tp` or by path), as argument lists, with
    the shell's expansions replaced by plain values."""
    import shlex

    text = text.replace("\\\n", " ")
    calls: dict[str, list[list[str]]] = {}
    # the parts: functions whose body starts on the next line (tp, left, share are one-liners)
    for name, body in re.findall(r"^(\w+)\(\) \{(?: #[^\n]*)?\n(.*?)^\}", text, re.MULTILINE | re.DOTALL):
        for line in body.splitlines():
            line = re.sub(r'"\$\([^)]*\)\)"|"\$\(share "\$1"\)"|"\$s"', "60", line.split(" #")[0])
            words = shlex.split(line.replace('"$OUT"', "/tmp/out").replace("$PY", "python3"))
            if words[:1] == ["tp"]:
                calls.setdefault(name, []).append(words[1:])
            elif "benchmarks/gpu_throughput.py" in words:
                calls.setdefault(name, []).append(words[words.index("benchmarks/gpu_throughput.py") + 1 :])
    return calls


def test_every_call_of_the_throughput_benchmark_parses():
    """A flag the benchmark does not know would end that part at once on the GPU."""
    import importlib.util
    import sys

    path = SCRIPT.parent / "gpu_throughput.py"
    spec = importlib.util.spec_from_file_location("gpu_throughput_for_session", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    calls = _throughput_calls(SCRIPT.read_text())
    assert {"eager", "trainer", "compiled", "inputs", "autotune"} <= set(calls), calls
    for part, argv_list in calls.items():
        for argv in argv_list:
            args = bench.parse(argv)  # argparse exits (SystemExit 2) on an unknown flag or value
            assert args.sections, (part, argv)
    compiled = bench.parse(calls["compiled"][0])
    assert compiled.step == ["recon", "distill"] and compiled.modes == ["compile"]
