"""A rank's start: what it loads before its first step (benchmarks/smoke_start.py measures it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.trainer.runs import free_port

CHECK = textwrap.dedent(
    """
    import os, sys
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], DS_ACCELERATOR="cpu")
    import torch, deepspeed
    from trainer.runtime import skip_deepspeed_muon
    skip_deepspeed_muon()
    deepspeed.init_distributed(dist_backend="gloo")
    from deepspeed.runtime.zero.utils import is_zero_supported_optimizer
    supported = is_zero_supported_optimizer(torch.optim.AdamW(torch.nn.Linear(2, 2).parameters()))
    print(supported, "torch._inductor.compile_fx" in sys.modules)
    """
)


def test_deepspeeds_zero_check_loads_no_inductor_and_still_accepts_adamw():
    # DeepSpeed's check imports its Muon optimizer, whose module calls torch.compile at import:
    # all of Inductor, 1-2 s of every eager rank's start
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(free_port())], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["True", "False"], done.stdout + done.stderr[-2000:]
