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
