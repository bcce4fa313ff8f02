"""The node agent: NVML readings turned into GPU samples (recorded readings of real boards, since
this machine has no GPU), the NVML call path against a scripted NVML, and the real agent process:
CPU-only samples, the run's processes by pid, and exiting when its stdin closes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from taehv_console.core.watch.nodeline import gpu_samples, parse_sample
from taehv_console.core.watch.nvml import NvmlSampler
from tests.core.watch.conftest import agent_line, nvml_fixture

MB = 1024 * 1024


def test_h100_training_reading_gives_per_gpu_numbers_in_console_units():
    reading = nvml_fixture("h100x8_training.json")
    owners = {24811 + i: 8 + i for i in range(8)}
    gpus = gpu_samples(reading, owners)
    assert [g.index for g in gpus] == list(range(8))
    g0 = gpus[0]
    assert g0.name == "NVIDIA H100 80GB HBM3" and g0.util_pct == 99.0 and g0.mem_util_pct == 41.0
    assert g0.mem_total_mb == pytest.approx(81559.0, abs=1)  # 85520809984 bytes
    assert g0.power_w == pytest.approx(652.311) and g0.power_limit_w == 700.0 and g0.temp_c == 63.0
    # GPU 0 also holds a monitoring exporter's memory: only the rank's own memory counts as the run's
    assert g0.run_pids == (24811,)
    exporter = 555745280 / MB
    assert g0.run_mem_mb == pytest.approx(72153497600 / MB - 512 - exporter, abs=0.1)
    # the software power cap is reported but is routine at full load: no slowdown named for it
    assert gpus[2].throttle == ("sw_power_cap",) and gpus[0].throttle == ()
    assert all(not g.error for g in gpus)


def test_processes_outside_the_run_are_not_counted_as_the_runs_memory():
    gpus = gpu_samples(nvml_fixture("h100x8_training.json"), owners={})
    assert all(g.run_mem_mb == 0 and g.run_pids == () for g in gpus)


def test_a_gpu_that_fell_off_the_bus_is_reported_with_nvmls_error():
    gpus = gpu_samples(nvml_fixture("h100x8_gpu5_lost.json"))
    assert len(gpus) == 8
    assert gpus[5].error == "GPU is lost" and gpus[5].util_pct is None and gpus[5].mem_total_mb is None
    assert [g.index for g in gpus if g.error] == [5]


def test_thermal_slowdown_and_unsupported_power_fields():
    gpus = gpu_samples(nvml_fixture("a100x8_gpu2_thermal.json"))
    assert gpus[2].throttle == ("sw_thermal", "hw_thermal") and gpus[2].temp_c == 91.0
    assert (
        gpus[7].power_w is None and gpus[7].power_limit_w is None and not gpus[7].error
    )  # NotSupported != lost


def test_container_without_process_visibility_and_idle_gpu():
    gpus = gpu_samples(nvml_fixture("a800x1_idle_container.json"), owners={777: 0})
    assert gpus[0].util_pct == 0.0 and gpus[0].throttle == ()  # GPU idle (0x1) is not a slowdown
    assert gpus[0].run_pids == (777,) and gpus[0].run_mem_mb == 0.0  # memory not visible: 0, no crash


def test_no_nvml_reading_gives_no_gpus():
    assert gpu_samples(nvml_fixture("no_nvml_library.json")) == ()


def test_recorded_agent_line_of_a_gpu_node_parses_into_a_node_sample():
    s = parse_sample(agent_line("agent_line_h100_node2.json"), received=1759516621.6)
    assert s.host == "gpu-node-2" and s.gpu_ok and len(s.gpus) == 8 and s.seq == 4211
    assert s.cpu_count == 192 and s.ram_total_gb == pytest.approx(2015.588) and s.net_rx_mbps > 18000
    assert s.disks[0].path == "/shared/runs/taehv-64gpu" and s.disks[0].free_gb == pytest.approx(41165.9)
    assert {p.rank for p in s.processes} == set(range(8, 16))
    # each rank's GPU memory is found through its pid (dataloader workers are in `owners` too)
    assert s.process(24811).gpu_mem_mb == pytest.approx(s.gpus[0].run_mem_mb, abs=0.2)
    assert s.process(24814).status == "sleeping" and s.received == 1759516621.6


def test_an_agent_line_printed_on_a_real_h100_parses():
    # benchmarks/gpu_session.sh ran the agent on a lent H100 (driver 580.159.04), idle, no run
    s = parse_sample(agent_line("agent_line_h100_lent_idle.json"))
    assert s.gpu_ok and len(s.gpus) == 1 and s.cpu_count == 16
    g = s.gpus[0]
    assert g.name == "NVIDIA H100 80GB HBM3" and g.util_pct == 0 and g.temp_c == 55
    assert g.mem_total_mb == pytest.approx(85520809984 / 2**20, abs=1)
    assert g.power_w == pytest.approx(140.0, abs=0.1) and g.ecc_uncorrected == 0


def test_cpu_only_agent_line_carries_the_flag_and_the_reason():
    s = parse_sample(agent_line("agent_line_cpu_only.json"))
    assert not s.gpu_ok and s.gpus == () and "NVML" in s.gpu_reason
    assert s.process(32338).status == "stopped" and s.process(32338).alive
    assert s.process(1) is None


@pytest.mark.parametrize("line", ["", "not json", "[1, 2]", '{"host": "x"}', '{"time": 1}'])
def test_lines_that_are_not_samples_are_refused(line):
    with pytest.raises(ValueError):
        parse_sample(line)


class _ScriptedNvml:
    """The parts of pynvml the agent calls, answering from a recorded reading (GPU 5 lost, power
    NotSupported on one board), so the call path is exercised without a GPU."""

    class NVMLError(Exception):
        pass

    def __init__(self, reading: dict):
        self.devs = reading["devices"]
        self.shutdown = False

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdown = True

    def nvmlSystemGetDriverVersion(self):
        return b"550.54.15"

    def nvmlDeviceGetCount(self):
        return len(self.devs)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def _dev(self, h, key):
        d = self.devs[h]
        if key in d.get("errors", {}):
            raise self.NVMLError(d["errors"][key])
        return d[key]

    def nvmlDeviceGetName(self, h):
        return self._dev(h, "name").encode()

    def nvmlDeviceGetUUID(self, h):
        return self._dev(h, "uuid")

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(**self._dev(h, "utilization"))

    def nvmlDeviceGetMemoryInfo(self, h):
        m = self._dev(h, "memory")
        return SimpleNamespace(used=m["used"], total=m["total"], free=m["total"] - m["used"])

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == 0
        return self._dev(h, "temperature")

    def nvmlDeviceGetPowerUsage(self, h):
        return self._dev(h, "power_usage_mw")

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._dev(h, "power_limit_mw")

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._dev(h, "clocks_event_reasons")

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        # NVML's "not available" memory is a huge sentinel (~2^64): the agent must turn it into null
        return [
            SimpleNamespace(
                pid=p["pid"],
                usedGpuMemory=p["used_memory"] if p["used_memory"] is not None else 18446744073709551615,
            )
            for p in self._dev(h, "processes")
        ]


@pytest.mark.parametrize(
    "fixture",
    [
        "h100x8_training.json",
        "h100x8_gpu5_lost.json",
        "a100x8_gpu2_thermal.json",
        "a800x1_idle_container.json",
    ],
)
def test_nvml_sampler_reads_what_the_recorded_readings_hold(fixture):
    recorded = nvml_fixture(fixture)
    nv = _ScriptedNvml(recorded)
    sampler = NvmlSampler(nv)
    reading = sampler.read()
    assert reading["ok"] and reading["driver_version"] == "550.54.15"
    # what the sampler produces parses to the same GPU samples as the recorded reading
    owners = {p["pid"]: 0 for d in recorded["devices"] for p in d.get("processes", ())}
    assert gpu_samples(reading, owners) == gpu_samples(recorded, owners)
    sampler.close()
    assert nv.shutdown


def test_nvml_missing_gives_a_reason_not_an_exception():
    class Broken:
        def nvmlInit(self):
            raise RuntimeError("NVML Shared Library Not Found")

    s = NvmlSampler(Broken())
    assert not s.ok and s.read() == {
        "ok": False,
        "reason": "NVML unavailable: NVML Shared Library Not Found",
        "devices": [],
    }


def _has_gpu() -> bool:
    return NvmlSampler().ok


@pytest.mark.skipif(
    not _has_gpu(), reason="no NVIDIA GPU/NVML on this machine: live NVML is checked on GPU hosts"
)
def test_live_nvml_reading_on_a_gpu_host():
    sampler = NvmlSampler()
    reading = sampler.read()
    sampler.close()
    gpus = gpu_samples(reading)
    assert gpus and all(g.mem_total_mb and g.mem_total_mb > 1000 for g in gpus)
    assert all(g.util_pct is not None and 0 <= g.util_pct <= 100 for g in gpus)
    assert all(g.temp_c is not None and 0 < g.temp_c < 120 for g in gpus)


# ------------------------------------------------------------------------------- the real process


def _agent(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "taehv_console.core.watch.agent", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_agent_prints_cpu_only_samples_here_and_exits_when_stdin_closes(tmp_path):
    proc = _agent("--interval", "0.2", "--disk", str(tmp_path))
    try:
        first = parse_sample(proc.stdout.readline())
        second = parse_sample(proc.stdout.readline())
        assert not first.gpu_ok and first.gpu_reason  # no GPU here: a CPU-only sample, flagged
        assert second.seq == first.seq + 1 and 0.1 < second.time - first.time < 1.0
        assert second.cpu_count == os.cpu_count() and second.ram_total_gb > 0 and second.cpu_pct is not None
        assert second.disks[0].path == str(tmp_path) and second.disks[0].total_gb > 0
        t0 = time.time()
        proc.stdin.close()  # the console went away
        assert proc.wait(timeout=5) == 0
        assert time.time() - t0 < 1.5  # it notices within one interval, not at some later write
    finally:
        if proc.poll() is None:
            proc.kill()


def test_agent_reports_the_runs_processes_from_heartbeats(tmp_path):
    run = tmp_path / "run"
    (run / "heartbeat").mkdir(parents=True)
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    other_host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = socket.gethostname()
        (run / "heartbeat" / "rank-3.json").write_text(
            json.dumps({"step": 5, "time": time.time(), "pid": child.pid, "host": host})
        )
        # a rank on another machine: its pid means nothing here and must not be looked up
        (run / "heartbeat" / "rank-4.json").write_text(
            json.dumps({"step": 5, "time": time.time(), "pid": other_host.pid, "host": "elsewhere"})
        )
        proc = _agent("--interval", "0.2", "--run", str(run))
        try:
            s = parse_sample(proc.stdout.readline())
            assert [(p.pid, p.rank) for p in s.processes] == [(child.pid, 3)]
            assert s.processes[0].status in ("running", "sleeping") and s.processes[0].rss_mb > 1
            os.kill(child.pid, signal.SIGSTOP)
            deadline = time.time() + 5
            while time.time() < deadline and s.process(child.pid).status != "stopped":
                s = parse_sample(proc.stdout.readline())
            assert s.process(child.pid).status == "stopped"
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
            deadline = time.time() + 5
            while time.time() < deadline and s.process(child.pid).alive:
                s = parse_sample(proc.stdout.readline())
            assert s.process(child.pid).status == "gone" and not s.process(child.pid).alive
        finally:
            proc.stdin.close()
            proc.wait(timeout=5)
    finally:
        for p in (child, other_host):
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture
def beat(tmp_path):
    """beat(rank, pid, host) writes rank N's heartbeat in tmp_path/run/heartbeat."""
    beats = tmp_path / "run" / "heartbeat"
    beats.mkdir(parents=True)

    def write(rank: int, pid: int, host: str) -> None:
        (beats / f"rank-{rank}.json").write_text(
            json.dumps({"step": 1, "time": time.time(), "pid": pid, "host": host})
        )

    return write


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """The names of the files read through Path.read_text from here on: what an agent costs the
    shared storage the heartbeats are on."""
    read: list[str] = []
    real = Path.read_text

    def counting(self, *a, **kw):
        read.append(self.name)
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "read_text", counting)
    return read


def test_once_its_nodes_ranks_are_all_found_an_agent_reads_only_their_heartbeats(tmp_path, beat, reads):
    """Finding a node's ranks means reading every heartbeat (the names do not say the host); at
    256 nodes x 2,048 files on shared storage that must not go on every refresh. Once as many ranks
    as LOCAL_WORLD_SIZE says are found, only their files are read; a rank that moves away brings
    back full reads, and without LOCAL_WORLD_SIZE every read stays a full one."""
    from taehv_console.core.watch.agent import RunProcesses

    beats = tmp_path / "run" / "heartbeat"
    host = socket.gethostname()
    env = {**os.environ, "LOCAL_WORLD_SIZE": "2"}
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    ours = {r: subprocess.Popen(sleeper, env=env) for r in (3, 5)}
    bare = subprocess.Popen(sleeper)  # no LOCAL_WORLD_SIZE in its environment
    try:
        for r, p in ours.items():
            beat(r, p.pid, host)
        for r in (*range(6, 40), 4):  # the other nodes' ranks
            beat(r, 100000 + r, f"node-{r // 8}")
        every = len(list(beats.iterdir()))  # 37 files
        read = reads
        read.clear()
        procs = RunProcesses(str(tmp_path / "run"), host)
        assert procs.current(0.0) == {ours[3].pid: 3, ours[5].pid: 5}
        assert len(read) == every  # the first read is a full one
        read.clear()
        assert procs.current(20.0) == {ours[3].pid: 3, ours[5].pid: 5}
        assert sorted(read) == ["rank-3.json", "rank-5.json"]  # then only this node's own
        # a dead rank is re-read at once (to report it gone), still only from its own file
        ours[5].kill()
        ours[5].wait()
        read.clear()
        assert procs.current(21.0, gone=True) == {ours[3].pid: 3, ours[5].pid: 5}
        assert sorted(read) == ["rank-3.json", "rank-5.json"]
        # relaunched elsewhere: its file names another host, so the node's ranks are searched again
        beat(5, 123456, "node-9")
        read.clear()
        assert procs.current(40.0) == {ours[3].pid: 3}
        assert len(read) == 2 + every
        read.clear()
        procs.current(60.0)  # one rank of LOCAL_WORLD_SIZE 2: still searching
        assert len(read) == every
        # ranks whose environment does not say how many a node runs: full reads, as before
        beat(3, bare.pid, host)
        procs = RunProcesses(str(tmp_path / "run"), host)
        for t in (0.0, 20.0):
            read.clear()
            assert procs.current(t) == {bare.pid: 3}
            assert len(read) == every
    finally:
        for p in (*ours.values(), bare):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_an_agent_takes_its_nodes_ranks_from_the_workers_environments(tmp_path, beat, reads):
    """At start-up no file of this node may exist yet while the other nodes' do: the workers'
    RANK/LOCAL_RANK/LOCAL_WORLD_SIZE (torchrun's) say which files are ours before any is written,
    so an agent never reads the whole folder. The launcher (no LOCAL_RANK) and another run's workers
    do not count."""
    from taehv_console.core.watch.agent import RunProcesses, _workers_ranks

    run = tmp_path / "run"
    host = socket.gethostname()
    for r in range(8, 40):  # the other nodes' ranks have all written
        beat(r, 100000 + r, f"node-{r // 8}")

    def until_found(ranks: tuple[int, ...]) -> None:
        deadline = time.time() + 10  # until the workers' argv and environments are in /proc
        while _workers_ranks(run) != ranks and time.time() < deadline:
            time.sleep(0.05)

    def worker(rank, local, run_arg, cwd):
        env = {**os.environ, "RANK": str(rank), "LOCAL_WORLD_SIZE": "2"}
        if local is not None:
            env["LOCAL_RANK"] = str(local)
        # the argv the launcher gives a worker: `python -m trainer.cli --run RUN`, here after -c
        argv = [sys.executable, "-c", "import time; time.sleep(120)", "-m", "trainer.cli", "--run", run_arg]
        return subprocess.Popen(argv, env=env, cwd=cwd)

    other = tmp_path / "other"
    other.mkdir()
    started = [
        worker(3, 0, str(run), "/"),
        worker(5, 1, "run", str(tmp_path)),  # a relative --run, from the worker's own directory
        worker(0, None, str(run), "/"),  # the launcher: RANK from a pod's environment, no LOCAL_RANK
        worker(7, 1, str(other), "/"),  # another run on this node
    ]
    try:
        until_found((3, 5))
        read = reads
        read.clear()
        procs = RunProcesses(str(run), host)
        assert procs.current(0.0) == {}  # nothing of ours written yet
        assert sorted(read) == ["rank-3.json", "rank-5.json"]  # and nothing else read
        # a file left by an earlier placement names another host: the process table still says
        # rank 3 is here, so this is no reason to read the whole folder
        beat(3, 4242, "node-7")
        read.clear()
        assert procs.current(2.0) == {}
        assert sorted(read) == ["rank-3.json", "rank-5.json"]
        beat(3, started[0].pid, host)
        beat(5, started[1].pid, host)
        read.clear()
        assert procs.current(4.0) == {started[0].pid: 3, started[1].pid: 5}
        assert sorted(read) == ["rank-3.json", "rank-5.json"]
        # relaunched with other ranks on this node; the old files still name this host (dead pids)
        for p in started[:2]:
            p.kill()
            p.wait()
        started += [worker(0, 0, str(run), "/"), worker(1, 1, str(run), "/")]
        until_found((0, 1))
        read.clear()
        assert procs.current(20.0, gone=True) == {}  # what the agent asks when a known pid is gone
        assert sorted(read) == ["rank-0.json", "rank-1.json"]
        beat(0, started[-2].pid, host)
        beat(1, started[-1].pid, host)
        assert procs.current(30.0) == {started[-2].pid: 0, started[-1].pid: 1}
        # the run failed and nothing relaunches: its dead pids bring no full reads
        for p in started[-2:]:
            p.kill()
            p.wait()
        read.clear()
        assert procs.current(40.0, gone=True) == {started[-2].pid: 0, started[-1].pid: 1}
        assert sorted(read) == ["rank-0.json", "rank-1.json"]
    finally:
        for p in started:
            p.kill()
            p.wait()


def test_agent_count_mode_ignores_a_closed_stdin_and_stops_by_itself():
    # what snapshot_once runs through runner.run: stdin is closed from the start
    r = subprocess.run(
        [sys.executable, "-m", "taehv_console.core.watch.agent", "--count", "2", "--interval", "0.1"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 0
    assert [parse_sample(ln).seq for ln in r.stdout.splitlines()] == [0, 1]


def test_agent_replays_recorded_readings_for_synthetic_nodes(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "taehv_console.core.watch.agent",
            "--count",
            "1",
            "--host-name",
            "node-07",
            "--replay",
            str((tmp_path / ".." / "x").resolve()),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode != 0  # a missing replay file is an error, not silently a CPU sample
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(nvml_fixture("h100x8_training.json")))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "taehv_console.core.watch.agent",
            "--count",
            "1",
            "--host-name",
            "node-07",
            "--replay",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    s = parse_sample(r.stdout)
    assert s.host == "node-07" and s.gpu_ok and len(s.gpus) == 8
