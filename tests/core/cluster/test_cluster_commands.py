"""`detect`, `preflight` and `trust` end to end against the loopback sshd: exit statuses, JSON,
the confirmation step of trust, and preflight's node-side tests (shared runs dir, master port,
all-reduce bandwidth) on real processes."""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys

import pytest

from taehv_console.cli import main
from taehv_console.core.cluster.platform import detect_topology
from taehv_console.core.cluster.preflight import PreflightOptions, run_preflight
from taehv_console.core.cluster.ssh import SshPool, connect
from taehv_console.core.models import Severity
from taehv_console.core.plan.presets import load_preset
from taehv_console.exit_codes import ExitCode


@pytest.fixture
def ssh_env(sshd, monkeypatch):
    for k, v in sshd.env().items():
        monkeypatch.setenv(k, v)
    return sshd


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Real videos for preflight's loader measurement (a folder without any would be an error)."""
    from trainer.synthetic import make_synthetic

    d = tmp_path_factory.mktemp("videos")
    make_synthetic(d, clips=2, frames=12, height=64, width=64)
    return d


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def cpu_config(nodes: int, ppn: int = 1, **extra):
    overrides = [
        f"topology.nodes={nodes}",
        f"topology.gpus_per_node={ppn}",
        'distributed.nccl_env={GLOO_SOCKET_IFNAME="lo"}',
        *extra,
    ]
    return load_preset("cpu-smoke", overrides=overrides).config


def test_detect_json_lists_every_host_of_the_hostfile(ssh_env, tmp_path, capsys):
    hf = ssh_env.write_hostfile(tmp_path / "hostfile", slots=2)
    assert main(["detect", "--hosts", str(hf), "--json", "--runs", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["topology"]["source"] == "hostfile"
    assert [n["host"] for n in out["nodes"]] == ssh_env.addresses
    assert all(n["facts"]["paths"][0]["exists"] for n in out["nodes"])


def test_detect_exits_nonzero_when_a_node_is_unreachable(ssh_env, tmp_path, capsys):
    hf = ssh_env.write_hostfile(tmp_path / "hostfile", hosts=[ssh_env.addresses[0], "127.0.0.9"])
    assert main(["detect", "--hosts", str(hf), "--connect-timeout", "3"]) == 1
    out = capsys.readouterr().out
    assert "127.0.0.9" in out and "refused" in out.lower()


def test_detect_refuses_a_hostfile_with_an_injected_host(ssh_env, tmp_path, capsys):
    marker = tmp_path / "pwned"
    hf = tmp_path / "hostfile"
    hf.write_text(f"127.0.0.2 slots=1\n$(touch {marker}) slots=1\n")
    assert main(["detect", "--hosts", str(hf)]) == 2
    assert f"{hf}:2" in capsys.readouterr().err
    assert not marker.exists()


def test_trust_adds_the_key_only_after_yes(ssh_env, tmp_path, monkeypatch, capsys):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    host = ssh_env.addresses[0]
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    assert main(["trust", host, "--known-hosts", str(kh)]) == 1
    shown = capsys.readouterr().out
    assert "SHA256:" in shown and "not added" in shown and kh.read_text() == ""
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no terminal, no answer: a no
    assert main(["trust", host, "--known-hosts", str(kh)]) == 1 and kh.read_text() == ""

    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    assert main(["trust", host, "--known-hosts", str(kh)]) == 0
    assert kh.read_text().startswith(f"[{host}]:{ssh_env.port} ssh-ed25519 ")
    capsys.readouterr()
    # now a connection goes through, and trusting again changes nothing
    settings = ssh_env.settings(known_hosts_path=str(kh))
    assert connect(host, settings).run(["true"]).ok
    assert main(["trust", host, "--known-hosts", str(kh)]) == 0
    assert "already trusted" in capsys.readouterr().out and len(kh.read_text().splitlines()) == 1


def test_trust_refuses_a_changed_key_unless_replace(ssh_env, tmp_path, monkeypatch, capsys):
    import paramiko

    host = ssh_env.addresses[1]
    kh = tmp_path / "known_hosts"
    forged = paramiko.Ed25519Key.from_private_key_file(ssh_env.key_path)  # not the host's key
    kh.write_text(f"[{host}]:{ssh_env.port} ssh-ed25519 {forged.get_base64()}\n")
    assert main(["trust", host, "--known-hosts", str(kh), "--yes"]) == 1
    assert "WARNING" in capsys.readouterr().out and forged.get_base64() in kh.read_text()
    assert main(["trust", host, "--known-hosts", str(kh), "--yes", "--replace"]) == 0
    assert forged.get_base64() not in kh.read_text()
    assert connect(host, ssh_env.settings(known_hosts_path=str(kh))).run(["true"]).ok


def test_preflight_hostfile_slots_beyond_devices_is_an_error(ssh_env, tmp_path, capsys, clips):
    hf = ssh_env.write_hostfile(tmp_path / "hostfile", slots=999, hosts=ssh_env.addresses[:2])
    code = main(
        [
            "preflight",
            "--hosts",
            str(hf),
            "--preset",
            "cpu-smoke",
            "--set",
            "topology.nodes=2",
            "--runs",
            str(tmp_path / "runs"),
            "--data",
            str(clips),
            "--master-port",
            str(free_port()),
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == ExitCode.PREFLIGHT_FAILED == 3 and not out["ok"]  # as --no-tui for the same finding
    errors = {(f["id"], f["node"]) for f in out["findings"] if f["severity"] == "error"}
    assert errors == {("slots-exceed-devices", h) for h in ssh_env.addresses[:2]}


def test_preflight_passes_on_two_good_nodes(ssh_env, tmp_path, capsys, clips):
    hf = ssh_env.write_hostfile(tmp_path / "hostfile", slots=1, hosts=ssh_env.addresses[:2])
    code = main(
        [
            "preflight",
            "--hosts",
            str(hf),
            "--preset",
            "cpu-smoke",
            "--set",
            "topology.nodes=2",
            "--set",
            "topology.gpus_per_node=1",
            "--runs",
            str(tmp_path / "runs"),
            "--data",
            str(clips),
            "--master-port",
            str(free_port()),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    # each node measured its loader over SSH, on its own view of the videos
    assert out.count("(loader-ok)") == 2 and "CPU-s per 8x64x64 clip" in out
    assert "(runs-shared)" in out and "ready to launch" in out
    assert list((tmp_path / "runs").iterdir()) == []  # the token was cleaned up


def test_preflight_master_port_busy_and_data_missing(ssh_env, tmp_path):
    port = free_port()
    holder = socket.socket()
    holder.bind(("0.0.0.0", port))
    holder.listen(1)
    try:
        hf = ssh_env.write_hostfile(tmp_path / "hostfile", slots=1, hosts=ssh_env.addresses[:2])
        topo = detect_topology({}, hf)
        with SshPool(ssh_env.settings()) as pool:
            report = run_preflight(
                topo,
                cpu_config(2),
                pool,
                PreflightOptions(
                    runs_dir=str(tmp_path / "runs"),
                    data_source=str(tmp_path / "no-such-videos"),
                    master_port=port,
                ),
            )
    finally:
        holder.close()
    errors = sorted((f.id, f.node) for f in report.errors)
    assert ("master-port-busy", ssh_env.addresses[0]) in errors
    assert ("data-missing", ssh_env.addresses[0]) in errors and (
        "data-missing",
        ssh_env.addresses[1],
    ) in errors
    assert not report.ok


def test_preflight_reports_an_unreachable_node_and_checks_the_rest(ssh_env, tmp_path):
    hf = ssh_env.write_hostfile(tmp_path / "hostfile", slots=1, hosts=[ssh_env.addresses[0], "127.0.0.9"])
    topo = detect_topology({}, hf)
    with SshPool(ssh_env.settings(connect_timeout_s=3)) as pool:
        report = run_preflight(
            topo,
            cpu_config(2),
            pool,
            PreflightOptions(
                runs_dir=str(tmp_path / "runs"), data_source=str(tmp_path), master_port=free_port()
            ),
        )
    [down] = [f for f in report.errors if f.id == "node-unreachable"]
    assert down.node == "127.0.0.9" and down.fix
    assert report.probes[0].ok  # the reachable node was probed all the same


def test_preflight_bandwidth_all_reduce_between_two_nodes(ssh_env, tmp_path):
    hf = ssh_env.write_hostfile(tmp_path / "hostfile", slots=1, hosts=ssh_env.addresses[:2])
    topo = detect_topology({}, hf)
    with SshPool(ssh_env.settings()) as pool:
        report = run_preflight(
            topo,
            cpu_config(2),
            pool,
            PreflightOptions(
                runs_dir=str(tmp_path / "runs"),
                data_source=str(tmp_path),
                master_port=free_port(),
                bandwidth=True,
                bandwidth_megabytes=4,
                assumed_gbps=10,
            ),
        )
    bw = report.bandwidth
    assert bw is not None, [f.message for f in report.findings if f.severity is Severity.ERROR]
    assert (bw.backend, bw.nodes, bw.bytes) == ("gloo", 2, 4_000_000)
    assert bw.algbw_gbps > 0 and bw.busbw_gbps == pytest.approx(bw.algbw_gbps, rel=1e-3)  # 2(N-1)/N = 1
    assert any(f.id in ("bandwidth", "bandwidth-low") and "busbw" in f.message for f in report.findings)


def test_help_imports_no_heavy_module_and_core_no_ui():
    code = (
        "import sys, contextlib, io\n"
        "from taehv_console import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try: cli.main(['--help'])\n"
        "    except SystemExit: pass\n"
        "heavy = [m for m in ('torch', 'paramiko', 'deepspeed') if m in sys.modules]\n"
        "import taehv_console.core.cluster.preflight, taehv_console.core.cluster.ssh\n"
        "import taehv_console.core.cluster.platform, taehv_console.core.cluster.probe\n"
        "ui = [m for m in ('textual', 'rich') if m in sys.modules]\n"
        "print(heavy, ui)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[] []"


def test_preflight_inside_a_platform_pod_checks_this_node_only(tmp_path, clips):
    # A PAI-DLC worker pod (rank 1 of 2): no SSH, the platform starts the other pod.
    env = {"MASTER_ADDR": "dlc1a2b3c4d5e6f-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "2", "RANK": "1"}
    topo = detect_topology(env, local_gpus=None)
    report = run_preflight(
        topo, cpu_config(2), options=PreflightOptions(runs_dir=str(tmp_path / "runs"), data_source=str(clips))
    )
    assert [p.host for p in report.probes] == ["localhost"] and report.probes[0].ok
    found = {f.id for f in report.findings}
    assert {"other-nodes-not-probed", "master-port-not-checked"} <= found
    assert report.ok, [f.message for f in report.errors]


def test_preflight_measures_the_loader_on_real_videos_and_names_the_workers_a_gpu_needs(tmp_path, clips):
    topo = detect_topology(
        {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "23456", "WORLD_SIZE": "1", "RANK": "0"}, local_gpus=None
    )
    # a GPU config: the planner's clips/s per GPU are far beyond what a 2-core test machine loads
    cfg = load_preset(
        "8gpu-h100",
        overrides=[
            "topology.nodes=1",
            "data.frames=8",
            "data.height=64",
            "data.width=64",
            "data.num_workers=1",
        ],
    ).config
    report = run_preflight(
        topo,
        cfg,
        options=PreflightOptions(runs_dir=str(tmp_path / "runs"), data_source=str(clips), loader_clips=2),
    )
    [slow] = [f for f in report.findings if f.id == "loader-too-slow"]
    assert slow.severity is Severity.WARNING and slow.node == "localhost"
    assert "h264 64x64" in slow.message and "1 worker(s) per GPU give" in slow.message
    need = int(slow.fix.split("data.num_workers=")[1].split()[0])
    assert need > 1
    # and a folder without videos stops the launch, naming the folder
    empty = tmp_path / "empty"
    empty.mkdir()
    report = run_preflight(
        topo, cpu_config(1), options=PreflightOptions(runs_dir=str(tmp_path / "runs"), data_source=str(empty))
    )
    [bad] = [f for f in report.errors if f.id == "data-gives-no-clips"]
    assert str(empty) in bad.message and "no video files" in bad.message
