"""A SLURM run launched again inside another allocation (a new `salloc`): its recorded hosts were
the old allocation's. The launch takes this allocation's first nodes and writes the launch files
for them; an allocation with too few nodes starts nothing and says why. The real two-node cluster
runs the same story in tests/slurm/test_slurm_runs.py."""

from __future__ import annotations

import pytest

from taehv_console.core.models import BackendKind
from taehv_console.core.plan.presets import load_preset
from taehv_console.core.run.control import RunController
from taehv_console.core.run.create import LaunchSpec, create_run
from taehv_console.core.run.outcome import AllocationTooSmallError


@pytest.fixture
def slurm_run(tmp_path, pool):
    cfg = load_preset(
        "cpu-smoke", overrides=["topology.nodes=2", "topology.gpus_per_node=1", "optim.max_steps=10"]
    ).config
    spec = LaunchSpec(
        backend=BackendKind.SLURM, hosts=("n1", "n2"), master_addr="n1", master_port=29999, env={}
    )
    run = create_run(tmp_path / "runs", cfg, spec)
    with RunController.open(run, pool, purpose="test") as ctrl:
        yield ctrl


def _main_ip(ctrl: RunController, node: int) -> str:
    text = (ctrl.run.path / f"accelerate-node-{node}.yaml").read_text()
    return next(
        line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("main_process_ip")
    )


def test_the_runs_hosts_in_this_allocation_change_nothing(slurm_run):
    ctrl = slurm_run
    ctrl._fit_allocation({"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_JOB_ID": "7"})
    assert ctrl.state.hosts == ("n1", "n2") and ctrl.run.read_state().hosts == ("n1", "n2")
    assert not ctrl.snapshot().notes


def test_another_allocations_nodes_take_the_runs_machine_ranks_and_its_launch_files(slurm_run):
    ctrl = slurm_run
    ctrl._fit_allocation({"SLURM_JOB_NODELIST": "gpu[07-09]", "SLURM_JOB_ID": "8"})
    state = ctrl.run.read_state()
    assert state.hosts == ("gpu07", "gpu08") and state.master_addr == "gpu07"
    assert _main_ip(ctrl, 0) == _main_ip(ctrl, 1) == "gpu07"  # node 0 is the rendezvous
    (note,) = ctrl.snapshot().notes
    assert "n1, n2" in note and "SLURM job 8" in note and "gpu07, gpu08" in note


def test_an_allocation_smaller_than_the_run_starts_nothing_and_says_why(slurm_run, monkeypatch):
    ctrl = slurm_run
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu07")
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    with pytest.raises(
        AllocationTooSmallError, match=r"has 1 node\(s\); the run needs 2 \(it ran on n1, n2\)"
    ):
        ctrl.launch()  # the check comes before anything starts
    assert ctrl.run.read_state().hosts == ("n1", "n2") and ctrl.attempt is None


def test_outside_an_allocation_nothing_is_checked(slurm_run):
    slurm_run._fit_allocation({})
    assert slurm_run.state.hosts == ("n1", "n2")
