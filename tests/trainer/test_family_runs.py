"""Every family trains to final weights through the trainer's own entry point (`python -m
trainer.cli`, one CPU rank, DeepSpeed ZeRO-2 on gloo, as torchrun starts a rank), at the family's
own clip rule, and its exported `.pth` loads by its name alone, strictly, into the author's class.

One rank and one step each: the multi-rank paths are the same code for every family (the other run
tests train taehv, and test_teacher distils taew2_1 on 2 ranks and loads its export the same way);
what differs per family is the model, its clip rule, its export name and the author's reading of
it, and that is what this runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.trainer.runs import base_config, events, free_port, write_run
from tests.trainer.test_families import AuthorTAE
from trainer.families import FAMILIES, exported_files
from trainer.model import TAEHV
from trainer.synthetic import make_synthetic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# taehv is every other run test's model, and taew2_1 test_teacher's 2-rank distillation's
TRAINED = [name for name in FAMILIES if name not in ("taehv", "taew2_1")]


@pytest.fixture(scope="module")
def long_clips(tmp_path_factory) -> Path:
    # 17 frames: H3's one chunk; 32x32: LTX's 8 x patch 4
    d = tmp_path_factory.mktemp("clips17")
    make_synthetic(d, clips=4, frames=20, height=40, width=40, seed=3)
    return d


@pytest.mark.parametrize("family", TRAINED)
def test_each_family_trains_to_final_weights_the_authors_class_loads_by_name(family, long_clips, tmp_path):
    frames = 17 if FAMILIES[family].chunks else 8
    cfg = base_config(
        long_clips,
        model={"family": family},
        topology={"gpus_per_node": 1},
        data={"frames": frames, "height": 32, "width": 32, "val_fraction": 0.5},
        optim={"grad_accum": 1, "max_steps": 1, "warmup_steps": 0},
        schedule={"val_every": 100, "checkpoint_every": 100},
    )
    run = write_run(tmp_path / "run", cfg)
    env = {
        **os.environ,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "DS_ACCELERATOR": "cpu",
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_USE_DEEPSPEED": "true",
    }
    done = subprocess.run(
        [sys.executable, "-m", "trainer.cli", "--run", str(run)],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert [e["step"] for e in events(run, 0, "step")] == [1]
    weights, _ema = exported_files(family)
    assert weights == f"{family}.safetensors"
    final = run / "final"
    trained = TAEHV.from_file(final / weights)  # the family from the file's metadata
    assert trained.family == family
    pth = final / f"{family}.pth"
    author = AuthorTAE(str(pth))  # torch.load, strict, the shapes from the file name alone
    ours = trained.state_dict()
    theirs = author.state_dict()
    assert list(theirs) == list(ours)
    assert all(torch.equal(theirs[k], ours[k]) for k in ours)
