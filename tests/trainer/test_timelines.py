"""Retention across timelines, with real DeepSpeed runs (1 CPU process): after `resume --from` an
older checkpoint, the next save keeps the new checkpoint and the resume source, `latest` names
the new one, and `resume latest` continues the new timeline, not the abandoned one."""

from __future__ import annotations

import tomllib

import pytest
import tomli_w

from tests.trainer.runs import base_config, events, run_to_end, write_run
from trainer import checkpoint as ckpt

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def set_max_steps(run, n: int) -> None:
    cfg = tomllib.loads((run / "run.toml").read_text())
    cfg["optim"]["max_steps"] = n
    (run / "run.toml").write_text(tomli_w.dumps(cfg))


def test_resume_from_an_older_checkpoint_keeps_its_lineage(tmp_path, clip_dir):
    run = write_run(tmp_path / "run", base_config(
        clip_dir, topology={"gpus_per_node": 1}, optim={"max_steps": 6},
        schedule={"checkpoint_every": 2, "val_every": 100, "keep_checkpoints": 2}))  # fmt: skip
    run_to_end(run, 1)
    root = run / "checkpoints"
    assert [s.step for s in ckpt.scan(root).complete] == [6, 4]

    set_max_steps(run, 5)  # one step on the new timeline, then its final save at step 5
    run_to_end(run, 1, ("--resume", str(root / "step-4")))
    assert [s.step for s in ckpt.scan(root).complete] == [5, 4]  # the new one and the source
    assert ckpt.read_latest(root) == ("step-5", None)
    moved = list((root / ckpt.ABANDONED).glob("*-at-step-4/step-6"))
    assert len(moved) == 1 and ckpt.verify(moved[0]).ok  # the old timeline is kept, out of the way
    start = events(run, 0, "start")[-1]
    assert start["resumed_from"] == str(root / "step-4") and start["abandoned"] == str(moved[0].parent)

    st, skipped = ckpt.resolve_resume(root, "latest")
    assert st.step == 5 and skipped == []  # not the abandoned step-6
