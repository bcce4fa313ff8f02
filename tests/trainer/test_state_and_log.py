"""The trainer's progress record (what trainer/state.json carries) and its rank-aware logger."""

from __future__ import annotations

import json
import math

from trainer.log import RankLogger
from trainer.state import TrainState


def test_train_state_round_trips_through_json_and_keeps_an_unset_best_as_null():
    state = TrainState(step=12, samples_consumed=40, nonfinite_skipped=1, data_skipped=2)
    saved = json.loads(json.dumps(state.state_dict()))  # as trainer/state.json holds it
    assert saved == {
        "step": 12,
        "best_psnr": None,
        "nonfinite_skipped": 1,
        "data_skipped": 2,
        "last_val": None,
    }
    again = TrainState()
    again.load_state_dict(saved)
    assert again.step == 12 and again.best_psnr == -math.inf and again.data_skipped == 2
    # samples_consumed is per rank: it travels in the rank's own state file, not in state.json
    assert again.samples_consumed == 0
    state.best_psnr, state.last_val = 21.5, {"step": 12, "psnr": 21.5}
    again.load_state_dict(json.loads(json.dumps(state.state_dict())))
    assert again.best_psnr == 21.5 and again.last_val == {"step": 12, "psnr": 21.5}


def test_state_json_of_an_older_trainer_without_counters_still_loads():
    state = TrainState()
    state.load_state_dict({"step": 3, "best_psnr": 18.0})
    assert (state.step, state.best_psnr, state.nonfinite_skipped, state.data_skipped) == (3, 18.0, 0, 0)


def test_rank_logger_speaks_once_unless_a_rank_has_its_own_news(capsys):
    RankLogger(rank=1).info("step 3/6 loss 0.1")
    RankLogger(rank=1).warning("rank 1: skipped a.mp4: corrupt", every_rank=True)
    RankLogger(rank=1).error("error: boom")
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["[taehv-train] rank 1: skipped a.mp4: corrupt", "[taehv-train] error: boom"]
    log = RankLogger(rank=0)
    log.info("val step 3: PSNR 20.00 dB")
    log.warning("checkpoint at step 3 FAILED: disk full")
    out, err = capsys.readouterr()
    assert out == "[taehv-train] val step 3: PSNR 20.00 dB\n"
    assert err == "[taehv-train] checkpoint at step 3 FAILED: disk full\n"


def test_giving_up_on_non_finite_losses_names_the_compiler_only_before_a_compiled_attempt_trained():
    from trainer.train import nonfinite_hint

    hint = nonfinite_hint(compiled=True, step=40, started_at=40)
    assert "model.compile=false" in hint and "since step 40" in hint
    assert nonfinite_hint(compiled=True, step=41, started_at=40) == ""  # it trained: not the compiler
    assert nonfinite_hint(compiled=False, step=40, started_at=40) == ""
