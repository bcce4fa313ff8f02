"""A checkpoint that takes longer than torchrun's own shutdown wait still completes on a stop.

torchrun forwards SIGTERM to its ranks and SIGKILLs them after TORCH_ELASTIC_SHUTDOWN_TIMEOUT
(30 s by default), whatever the console's grace period is. The console sets it to its grace, so
a rank writing a slow checkpoint (here: 40 s inside the save, by fault injection) is not killed
in the middle of it. One real DeepSpeed rank on this machine.
"""

from __future__ import annotations

import time

import pytest

from taehv_console.core.cluster.ssh import SshPool, SshSettings
from taehv_console.core.models import BackendKind
from taehv_console.core.plan.presets import load_preset
from taehv_console.core.run.control import RunController
from taehv_console.core.run.create import LaunchSpec, create_run
from tests.e2e.consoles import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

SLOW_SAVE_S = 40


def test_stop_waits_past_torchruns_default_for_a_slow_checkpoint(tmp_path):
    from trainer import checkpoint as ckpt
    from trainer.synthetic import make_synthetic

    clips = tmp_path / "clips"
    make_synthetic(clips, clips=6, frames=12, height=64, width=64, seed=5)
    cfg = load_preset(
        "cpu-smoke",
        overrides=[
            f'data.source="{clips}"',
            "topology.gpus_per_node=1",
            "optim.max_steps=1000",
            "schedule.checkpoint_every=1000",
            "schedule.val_every=1000",
        ],
    ).config
    spec = LaunchSpec(
        backend=BackendKind.LOCAL,
        hosts=("localhost",),
        master_addr="127.0.0.1",
        master_port=free_port(),
        env={"OMP_NUM_THREADS": "1", "TAEHV_FAULTS": f"ckpt_sleep:0:*:{SLOW_SAVE_S}"},
    )
    run = create_run(tmp_path / "runs", cfg, spec)
    with SshPool(SshSettings.from_env()) as pool, RunController.open(run, pool, purpose="test") as ctrl:
        ctrl.grace_s = 120
        ctrl.launch()
        deadline = time.time() + 240
        while ctrl._tail().progress.step < 1:
            assert time.time() < deadline, run.node_log(0).read_text()[-3000:]
            ctrl._tail().poll()
            time.sleep(0.2)
        t0 = time.time()
        record = ctrl.stop()
        took = time.time() - t0
    assert took > SLOW_SAVE_S  # it really waited for the slow save ...
    assert record.killed == () and record.verified  # ... and nobody needed SIGKILL
    assert record.checkpoint_step is not None
    assert ckpt.scan(run.checkpoints).newest.step == record.checkpoint_step
    log = run.node_log(0).read_text()
    assert "forcefully exiting" not in log  # torchrun's SIGKILL after its shutdown timeout
