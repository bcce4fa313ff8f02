"""The README's table of families, where their weights load and what each needs, says what the
code's one table (trainer/families.py) and the exporter say: every family once, its model, teacher
class, clip rule and the file name the author's class loads it by."""

from __future__ import annotations

import re
from pathlib import Path

from trainer.families import FAMILIES, clip_rule, exported_files

README = Path(__file__).resolve().parents[1] / "README.md"


def table_rows() -> dict[str, list[str]]:
    text = README.read_text()
    section = text[text.index("### Families and where their weights load") :]
    section = section[: section.index("\n### ", 5)]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        m = re.match(r"\| `([a-z0-9_]+)` \|", line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} has two rows"
            rows[m.group(1)] = [c.strip() for c in line.strip().strip("|").split("|")]
    return rows


def test_the_readme_lists_every_family_as_the_code_has_it():
    rows = table_rows()
    assert sorted(rows) == sorted(FAMILIES)
    for name, fam in FAMILIES.items():
        _, serves, teacher, rule, author_file, *_loaders = rows[name]
        assert serves == fam.serves, (name, serves)
        assert teacher.startswith(f"`{fam.teacher_class}`"), (name, teacher)
        if fam.teacher_class == "AutoencoderKLWan":
            assert f"z_dim {fam.latent_channels}" in teacher, (name, teacher)
        r = clip_rule(name)
        assert rule == f"{r.frame_quantum}·n frames, {r.space_scale} px", (name, rule)
        weights, _ema = exported_files(name)
        assert author_file == f"`{Path(weights).stem}.pth`", (name, author_file)
