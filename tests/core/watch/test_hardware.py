"""Hardware evidence from the agents' NVML samples (core/watch/hardware.py): recorded readings (this
machine has no GPU) parsed as the console parses an agent's line; the agent's ECC query against a
scripted NVML that raises pynvml's own errors; and RunWatch.hardware() on real agent processes
replaying recorded readings, through the real monitor."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from taehv_console.core.cluster.ssh import SshPool, SshSettings
from taehv_console.core.models import BackendKind
from taehv_console.core.watch.hardware import first_gpu_counts, hardware_evidence
from taehv_console.core.watch.nodeline import gpu_samples, parse_sample
from taehv_console.core.watch.nodesample import NodeSample
from taehv_console.core.watch.nvml import NvmlSampler
from taehv_console.core.watch.runwatch import RunWatch
from taehv_console.core.watch.state import NodeSnapshot, NodeState, RunHeader, RunView
from taehv_console.core.watch.streams import LocalLineStream
from tests.core.watch.conftest import agent_line, fast_config, nvml_fixture
from tests.core.watch.test_agent import _ScriptedNvml

ECC = "ecc_uncorrected_volatile"


def sample(reading: dict[str, Any], host: str = "gpu-node-2") -> NodeSample:
    """A recorded H100 node's agent line carrying `reading` as its NVML part, parsed by the console."""
    line = json.loads(agent_line("agent_line_h100_node2.json"))
    line.update(host=host, nvml=reading)
    return parse_sample(json.dumps(line), received=line["time"] + 0.1)


def node(name: str, s: NodeSample | None, state: NodeState = NodeState.OK, detail: str = "") -> NodeSnapshot:
    return NodeSnapshot(name=name, state=state, detail=detail, sample=s, sample_age_s=0.4 if s else None)


def view(*nodes: NodeSnapshot) -> RunView:
    return RunView(time=1759516622.0, seq=1, run=RunHeader(run_dir="/runs/r", run_id="r"), nodes=nodes)


# ------------------------------------------------------------------------------ evidence by kind


def test_a_gpu_lost_off_the_bus_is_evidence_naming_the_gpu():
    v = view(
        node("gpu-node-1", sample(nvml_fixture("h100x8_training.json"), "gpu-node-1")),
        node("gpu-node-2", sample(nvml_fixture("h100x8_gpu5_lost.json"))),
    )
    assert hardware_evidence(v) == {"gpu-node-2": "GPU 5: GPU is lost"}


def test_uncorrectable_ecc_errors_are_evidence_with_their_count():
    s = sample(nvml_fixture("h100x8_gpu2_ecc.json"))
    assert [g.ecc_uncorrected for g in s.gpus] == [0, 0, 4, 0, 0, 0, 0, 0]
    assert hardware_evidence(view(node("gpu-node-2", s))) == {
        "gpu-node-2": "GPU 2: 4 uncorrectable ECC errors"
    }
    one = nvml_fixture("h100x8_gpu2_ecc.json")
    one["devices"][2][ECC] = 1
    assert hardware_evidence(view(node("n", sample(one)))) == {"n": "GPU 2: 1 uncorrectable ECC error"}


def test_gpus_gone_since_the_first_sample_are_evidence():
    first = view(node("gpu-node-2", sample(nvml_fixture("h100x8_training.json"))))
    counts = first_gpu_counts(first, {})
    assert counts == {"gpu-node-2": 8}
    after = view(node("gpu-node-2", sample(nvml_fixture("h100x6_after_two_fell_off.json"))))
    assert hardware_evidence(after, counts) == {"gpu-node-2": "6 of 8 GPUs left since the first sample"}
    # the first count is kept: a later, smaller one does not become the baseline
    assert first_gpu_counts(after, counts) == {"gpu-node-2": 8}
    # without the remembered count, one sample cannot tell: the other checks still run
    assert hardware_evidence(after) == {}


def test_nvml_gone_since_the_first_sample_is_evidence_with_nvmls_reason():
    class DriverGone:  # what nvmlInit raises after the driver was unloaded (a GPU took it down)
        def nvmlInit(self):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    reading = NvmlSampler(DriverGone()).read()
    gone = view(node("gpu-node-2", sample(reading)))
    assert hardware_evidence(gone, {"gpu-node-2": 8}) == {
        "gpu-node-2": "0 of 8 GPUs left since the first sample (NVML unavailable: Driver Not Loaded)"
    }


def test_a_cpu_only_first_sample_is_no_baseline():
    cpu = view(node("vm", parse_sample(agent_line("agent_line_cpu_only.json"))))
    assert first_gpu_counts(cpu, {}) == {}
    known = {"gpu-node-2": 8}
    assert first_gpu_counts(cpu, known) is known  # nothing new: the same mapping, no copy
    assert hardware_evidence(cpu, first_gpu_counts(cpu, {})) == {}


def test_every_piece_of_evidence_on_a_node_is_in_its_one_line():
    reading = nvml_fixture("h100x8_gpu5_lost.json")
    reading["devices"][2][ECC] = 2
    s = sample(reading)
    assert hardware_evidence(view(node("gpu-node-2", s)), {"gpu-node-2": 9}) == {
        "gpu-node-2": "8 of 9 GPUs left since the first sample; GPU 2: 2 uncorrectable ECC errors; "
        "GPU 5: GPU is lost"
    }


# ----------------------------------------------------------------------------------- no evidence


@pytest.mark.parametrize(
    "fixture",
    [
        "h100x8_training.json",
        "a100x8_gpu2_thermal.json",
        "a800x1_idle_container.json",
        "no_nvml_library.json",
    ],
)
def test_a_healthy_node_gives_none(fixture):
    # thermal slowdown and NotSupported power fields degrade a node, but are no hardware fault
    s = sample(nvml_fixture(fixture))
    counts = first_gpu_counts(view(node("n", s)), {})
    assert hardware_evidence(view(node("n", s)), counts) == {}
    zero = nvml_fixture("h100x8_gpu2_ecc.json")
    zero["devices"][2][ECC] = 0
    assert hardware_evidence(view(node("n", sample(zero))), {"n": 8}) == {}


def test_a_silent_agent_gives_none():
    healthy = sample(nvml_fixture("h100x8_training.json"))
    v = view(
        node("never-heard", None, NodeState.LOST, "no agent sample in 20 s: restarting: exit 255"),
        node("gpu-node-2", healthy, NodeState.LOST, "agent silent for 12 s"),
    )
    assert hardware_evidence(v, {"gpu-node-2": 8, "never-heard": 8}) == {}
    # what its last sample showed still stands
    lost = view(node("n", sample(nvml_fixture("h100x8_gpu5_lost.json")), NodeState.LOST, "agent silent"))
    assert hardware_evidence(lost) == {"n": "GPU 5: GPU is lost"}


def test_an_older_agents_line_without_the_ecc_count_parses():
    # recorded from an agent before the ECC count: no field, so unknown, never an error or evidence
    s = parse_sample(agent_line("agent_line_h100_node2.json"))
    assert s.gpu_ok and len(s.gpus) == 8
    assert all(g.ecc_uncorrected is None and not g.error for g in s.gpus)
    assert s.gpus[0].util_pct == 99.0  # the rest of the line as before
    assert hardware_evidence(view(node("gpu-node-2", s)), {"gpu-node-2": 8}) == {}


# --------------------------------------------------------------------------- the agent's NVML read


class _EccNvml(_ScriptedNvml):
    """The scripted NVML of test_agent, answering the ECC count from the recorded reading with
    pynvml's own errors: a device off the bus is lost; a reading recorded without the count is a
    board that answers NotSupported (no ECC, or ECC off)."""

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type):
        assert (error_type, counter_type) == (
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            pynvml.NVML_VOLATILE_ECC,
        )
        d = self.devs[h]
        if d.get("error"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if ECC not in d:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return d[ECC]


def test_the_agent_reads_the_volatile_uncorrectable_ecc_count():
    recorded = nvml_fixture("h100x8_gpu2_ecc.json")
    reading = NvmlSampler(_EccNvml(recorded)).read()
    assert [d[ECC] for d in reading["devices"]] == [0, 0, 4, 0, 0, 0, 0, 0]
    assert not any("errors" in d for d in reading["devices"])
    assert gpu_samples(reading) == gpu_samples(recorded)


def test_a_board_without_ecc_gives_no_count_and_no_error():
    reading = NvmlSampler(_EccNvml(nvml_fixture("a100x8_gpu2_thermal.json"))).read()
    assert not any(ECC in d for d in reading["devices"])
    # only the NotSupported power fields GPU 7 always had; ECC's NotSupported is no error
    assert [(d["index"], sorted(d["errors"])) for d in reading["devices"] if "errors" in d] == [
        (7, ["power_limit_mw", "power_usage_mw"])
    ]
    assert all(g.ecc_uncorrected is None and not g.error for g in gpu_samples(reading))


def test_a_lost_gpus_ecc_query_fails_like_the_rest():
    reading = NvmlSampler(_EccNvml(nvml_fixture("h100x8_gpu5_lost.json"))).read()
    lost = reading["devices"][5]
    assert lost["errors"][ECC] == "GPU is lost" and lost["error"] == "GPU is lost"
    assert hardware_evidence(view(node("n", sample(reading)))) == {"n": "GPU 5: GPU is lost"}


# ------------------------------------------------------------------ RunWatch on replaying agents


def _replaying_agents(run: Path, readings: dict[str, Path]) -> Callable[[str], LocalLineStream]:
    """host -> a real agent process replaying the NVML reading in readings[host], read at its start
    (so a restarted agent reports what the file holds then, as NVML opened anew would)."""

    def open_agent(host: str) -> LocalLineStream:
        argv = [sys.executable, "-m", "taehv_console.core.watch.agent", "--interval", "0.25"]
        return LocalLineStream(
            [*argv, "--run", str(run), "--replay", str(readings[host]), "--host-name", host]
        )

    return open_agent


def _wait(watch: RunWatch, pred: Callable[[RunView], bool], what: str, timeout: float = 30.0) -> RunView:
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = watch.view()
        if pred(v):
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}: {[(n.name, n.state, n.detail) for n in v.nodes]}")


def _gpus(v: RunView, host: str) -> int | None:
    n = v.node(host)
    return len(n.sample.gpus) if n is not None and n.sample is not None else None


def test_run_watch_names_the_nodes_with_bad_hardware_and_not_a_silent_one(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    files = {h: tmp_path / f"{h}.json" for h in ("node-a", "node-b", "node-c")}
    files["node-a"].write_text(json.dumps(nvml_fixture("h100x8_gpu2_ecc.json")))
    files["node-b"].write_text(json.dumps(nvml_fixture("h100x8_training.json")))
    files["node-c"].write_text(json.dumps(nvml_fixture("h100x8_training.json")))
    cfg = fast_config(agent_timeout_s=1.5)
    with SshPool(SshSettings.from_env()) as pool:
        watch = RunWatch(
            run, pool, BackendKind.SSH, list(files), config=cfg, agent_stream=_replaying_agents(run, files)
        )
        watch.start()
        stopped: list[int] = []
        try:
            # no one asks before node-c's GPUs are gone: the watch noted its first count by itself
            v = _wait(watch, lambda v: all(_gpus(v, h) == 8 for h in files), "every node's first sample")
            # node-c's driver is reloaded with two GPUs gone: its agent starts again and sees six
            files["node-c"].write_text(json.dumps(nvml_fixture("h100x6_after_two_fell_off.json")))
            os.kill(v.node("node-c").sample.agent_pid, signal.SIGKILL)
            # node-b's agent stops answering (stopped, as a hung SSH channel would leave it)
            b_pid = v.node("node-b").sample.agent_pid
            os.kill(b_pid, signal.SIGSTOP)
            stopped.append(b_pid)
            v = _wait(
                watch,
                lambda v: _gpus(v, "node-c") == 6 and v.node("node-b").state is NodeState.LOST,
                "node-c's new agent sample and node-b lost",
            )
            assert watch.hardware() == {
                "node-a": "GPU 2: 4 uncorrectable ECC errors",
                "node-c": "6 of 8 GPUs left since the first sample",
            }
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError):  # the watch may have ended it already
                    os.kill(pid, signal.SIGCONT)
            watch.stop()
