"""The SLURM backends' reading of SLURM's answers, on recorded output. Everything that talks to
SLURM itself runs against the real loopback cluster in tests/slurm/test_slurm_backends.py; what
stays here is what that cluster cannot produce: sacct lines (it has no accounting database)."""

from __future__ import annotations

import pytest

from taehv_console.core.run.backends import SbatchBackend


@pytest.mark.parametrize(
    "state, code, expected",
    [
        ("FAILED", "1:0", 1),
        ("CANCELLED by 0", "0:15", -15),
        ("COMPLETED", "0:0", 0),
        ("TIMEOUT", "0:0", 0),
        ("RUNNING", "0:0", None),
        ("COMPLETING", "1:0", None),
        ("", "", None),
    ],
)
def test_a_jobs_state_and_exit_code_read_as_sacct_and_scontrol_print_them(state, code, expected):
    assert SbatchBackend()._exit_code(state, code) == expected
