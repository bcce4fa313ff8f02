"""Fixtures for the trainer tests: a shared set of real synthetic video clips."""

from pathlib import Path

import pytest

from trainer.synthetic import make_synthetic


@pytest.fixture(scope="session")
def clip_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("clips")
    make_synthetic(d, clips=8, frames=12, height=64, width=80, seed=7)
    return d
