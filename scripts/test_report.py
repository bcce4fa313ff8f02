"""Sums up the suite's timing files (tests/timing.py writes one per pytest session) into
`test-output/durations.txt`: the slowest 30 tests and the time per test directory, each with its
CPU seconds (the tests' own processes, all cores), and how busy the machine's cores were. Prints
the suite's wall time, its ten slowest tests and one closing count line for every tier together.

    python scripts/test_report.py [--wall-s S] [--dir test-output]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path


def directory(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return path.rsplit("/", 1)[0] if "/" in path else "."


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("test-output"))
    ap.add_argument("--wall-s", type=float, default=None, help="the whole run's wall time")
    args = ap.parse_args(argv)
    tests: dict[str, dict] = {}
    tiers: list[tuple[str, float, int]] = []
    machine: dict | None = None  # the longest session's view of the machine covers the run
    for f in sorted(args.dir.glob("timing-*.json")):
        try:
            doc = json.loads(f.read_text())
            tests.update(doc["tests"])
            tiers.append((str(doc["tier"]), float(doc["wall_s"]), len(doc["tests"])))
            seen = doc.get("machine")
            if isinstance(seen, dict) and (machine is None or seen["total_s"] > machine["total_s"]):
                machine = seen
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"test_report: {f} not read ({e})", file=sys.stderr)
    if not tests:
        print(f"test_report: no timing files in {args.dir}", file=sys.stderr)
        return 1
    slowest = sorted(tests.items(), key=lambda kv: -kv[1]["s"])
    per_dir: dict[str, float] = defaultdict(float)
    cpu_dir: dict[str, float] = defaultdict(float)
    count_dir: Counter[str] = Counter()
    for nodeid, t in tests.items():
        per_dir[directory(nodeid)] += t["s"]
        cpu_dir[directory(nodeid)] += t.get("cpu_s", 0.0)
        count_dir[directory(nodeid)] += 1
    total = sum(t["s"] for t in tests.values())
    cpu = sum(t.get("cpu_s", 0.0) for t in tests.values())
    lines = [f"{len(tests)} tests, {total:.0f} s of test time, {cpu:.0f} CPU-s in the tests' own processes"]
    if args.wall_s is not None:
        lines[0] += f", {args.wall_s:.0f} s wall ({args.wall_s / 60:.1f} min)"
    lines += [f"tier {name}: {n} tests, {wall:.0f} s wall" for name, wall, n in tiers]
    if machine and machine.get("total_s"):
        cores = machine.get("cores") or 1
        lines.append(
            f"machine: {machine['busy_s']:.0f} CPU-s busy of {machine['total_s']:.0f} "
            f"({cores} cores x {machine['total_s'] / cores:.0f} s): "
            f"{100 * machine['busy_s'] / machine['total_s']:.0f} % busy, every process counted"
        )
    lines += ["", "time per directory (s, CPU-s, tests):"]
    lines += [
        f"{s:8.1f} {cpu_dir[d]:8.1f} {count_dir[d]:5d}  {d}"
        for d, s in sorted(per_dir.items(), key=lambda kv: -kv[1])
    ]
    lines += ["", "slowest 30 tests (s, CPU-s, outcome):"]
    lines += [
        f"{t['s']:8.1f} {t.get('cpu_s', 0.0):8.1f}  {t['outcome']:7s} {nodeid}" for nodeid, t in slowest[:30]
    ]
    args.dir.mkdir(parents=True, exist_ok=True)
    (args.dir / "durations.txt").write_text("\n".join(lines) + "\n")
    print(f"== where the time went (all of it: {args.dir / 'durations.txt'})")
    print("\n".join(lines[: 1 + len(tiers) + (1 if machine and machine.get("total_s") else 0)]))
    print("ten slowest:")
    print("\n".join(f"{t['s']:8.1f}  {nodeid}" for nodeid, t in slowest[:10]))
    outcomes = Counter(t["outcome"] for t in tests.values())
    bad = outcomes["failed"] + outcomes["error"]
    # one closing line for every tier together (each tier's own pytest summary is above it)
    print(f"suite: {outcomes['passed']} passed, {bad} failed, {outcomes['skipped']} skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
