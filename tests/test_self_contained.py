"""A user's clone has no sibling `shared` folder beside it: nothing the project ships or tests may read it."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A path that climbs out of the checkout into a sibling `shared` folder, in any spelling.
# (The pattern is assembled from its parts so that this guard does not itself read as a reach.)
_S = "shared"
REACHES_OUT = re.compile(rf"""\.\./{_S}|{_S}/reference|["']{_S}["']\s*/|/\s*["']{_S}["']""")


def test_no_tracked_file_reads_the_sibling_shared_folder():
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    offenders = []
    for name in files:
        path = ROOT / name
        if path.suffix not in {".py", ".sh", ".toml", ".cfg", ".ini", ".yaml", ".yml"} and name not in {
            "Makefile",
            ".ci/run",
        }:
            continue
        if name == "tests/test_self_contained.py":
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if REACHES_OUT.search(line):
                offenders.append(f"{name}:{n}: {line.strip()}")
    assert not offenders, (
        "files reaching for the sibling shared folder (copy what they need into the repo):\n"
        + "\n".join(offenders)
    )


def test_the_published_state_dict_fixture_is_in_the_repo():
    assert (ROOT / "tests" / "fixtures" / "taehv_state_dict.json").is_file()
