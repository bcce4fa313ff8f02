"""The run's verdict is one pure function of what its ranks said (their `stop` events) and whether
this console asked for a stop; the controller calls it wherever an attempt ends."""

from __future__ import annotations

import pytest

from taehv_console.core.run.backends import BackendKind, make_backend
from taehv_console.core.run.outcome import stop_step, verdict
from taehv_console.core.run.state import Phase


def _stops(**reasons: str) -> dict[int, dict]:
    return {
        int(r[1:]): {"kind": "stop", "reason": why, "step": 26, "time": 1.0} for r, why in reasons.items()
    }


@pytest.mark.parametrize(
    ("stops", "requested", "expected"),
    [
        (_stops(r0="done", r1="done"), False, Phase.DONE),
        (_stops(r0="done", r1="done"), True, Phase.DONE),  # it finished on its own while being stopped
        (_stops(r0="signal", r1="signal"), False, Phase.STOPPED),  # a signal from outside the console
        (_stops(r0="signal", r1="signal"), True, Phase.STOPPED),
        (_stops(r0="signal", r1="error"), True, Phase.FAILED),  # a rank failed on the way out
        (_stops(r0="done", r1="error"), False, Phase.FAILED),
        (_stops(r0="signal"), True, Phase.STOPPED),  # rank 1's last words never came, but we asked
        (_stops(r0="done"), False, Phase.FAILED),  # rank 1 ended without a word
        ({}, False, Phase.FAILED),
        (
            _stops(r0="done", r1="done", r5="error"),
            False,
            Phase.DONE,
        ),  # another node's rank: not ours to judge
    ],
)
def test_verdict(stops, requested, expected):
    assert verdict(stops, {0, 1}, stop_requested=requested) is expected


def test_stop_step_needs_every_rank_and_one_step():
    assert stop_step(_stops(r0="signal", r1="signal"), {0, 1}) == 26
    assert stop_step(_stops(r0="signal"), {0, 1}) is None
    assert stop_step(_stops(r0="signal", r1="error"), {0, 1}) is None
    two = _stops(r0="signal", r1="signal")
    two[1]["step"] = 27
    assert stop_step(two, {0, 1}) is None


def test_backends_dispatch_on_one_enum():
    assert {k.value for k in BackendKind} == {"local", "ssh", "platform", "slurm", "sbatch"}
    assert BackendKind("sbatch").slurm and BackendKind.SLURM.slurm and not BackendKind.SSH.slurm
    with pytest.raises(ValueError, match="unknown backend 'pbs'"):
        make_backend("pbs", pool=None)
