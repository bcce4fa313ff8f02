"""What the console offers when the world size changed: the exact conversion command the trainer
loads from (tests/trainer/test_universal.py runs it for real), and once converted, a plain resume."""

from __future__ import annotations

import shlex

import pytest

from taehv_console.core.run.control import RunController
from taehv_console.core.run.outcome import WorldSizeChangedError
from tests.core.run.conftest import make_run
from tests.core.run.test_control import _fake_checkpoint
from trainer import checkpoint as ckpt


def test_the_offered_conversion_is_the_trainers_and_a_converted_checkpoint_resumes(tmp_path, pool):
    run = make_run(tmp_path / "runs", nodes=1, per_node=2, max_steps=20)
    _fake_checkpoint(run, 4, world=4)
    step4 = run.checkpoints / "step-4"
    with RunController.open(run, pool) as ctrl:
        with pytest.raises(WorldSizeChangedError) as err:
            ctrl.resume_point()
        assert shlex.join(ckpt.universal_command(step4)) in str(err.value)
        assert "--inject_missing_state" in str(err.value) and f"taehv-console resume {run.run_id}" in str(
            err.value
        )
        # what ds_to_universal leaves when it has finished (its last file is the common optimizer state)
        (step4 / "universal" / "zero").mkdir(parents=True)
        (step4 / "universal" / "mp_rank_00_model_states.pt").write_bytes(b"x")
        with pytest.raises(WorldSizeChangedError):  # unfinished: still refused
            ctrl.resume_point()
        (step4 / "universal" / "zero" / "optimizer_state.pt").write_bytes(b"x")
        point = ctrl.resume_point()
        assert (point.spec, point.step, point.world_size) == ("latest", 4, 4)
