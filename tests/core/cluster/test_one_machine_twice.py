"""Two names for one machine in one node list (issue 44: `localhost` and `127.0.0.1` were two
nodes). The probe reports each node's boot id beside its hostname; preflight tells one machine
named twice from two machines: an error where the nodes would share its GPUs (NCCL refuses two
ranks on one GPU), a warning where they share only CPUs (how several nodes are tested on one
machine, the loopback sshd's included)."""

from __future__ import annotations

import json
from pathlib import Path

from taehv_console import cli
from taehv_console.core.cluster.preflight.network import check_one_machine_twice
from taehv_console.core.cluster.probe import probe_node
from taehv_console.core.models import NodeFacts, ProbeResult, Severity

BOOT = "ecc05ada-1111-2222-3333-444455556666"


def node(host: str, *, boot: str = BOOT, hostname: str = "gpu-a", gpus: tuple[int, ...] = ()) -> ProbeResult:
    return ProbeResult(host, NodeFacts(hostname=hostname, boot_id=boot, visible_gpu_indices=gpus))


def test_one_gpu_machine_named_twice_is_an_error_naming_both_entries():
    (finding,) = check_one_machine_twice(
        [node("gpu-a", gpus=tuple(range(8))), node("10.0.0.5", gpus=tuple(range(8))), node("gpu-b", boot="x")]
    )
    assert finding.id == "one-machine-twice" and finding.severity is Severity.ERROR
    assert finding.message.startswith("'gpu-a' and '10.0.0.5' are one machine (gpu-a, boot id ecc05ada)")
    assert "GPU(s) 0, 1, 2, 3, 4, 5, 6, 7" in finding.message and "NCCL refuses" in finding.message
    assert finding.fix == "list the machine once, with all its slots"


def test_one_machine_without_gpus_named_twice_is_a_warning():
    (finding,) = check_one_machine_twice([node("localhost"), node("127.0.0.1")])
    assert (
        finding.severity is Severity.WARNING
        and "'localhost' and '127.0.0.1' are one machine" in finding.message
    )


def test_disjoint_gpus_are_a_warning_only():
    (finding,) = check_one_machine_twice([node("a", gpus=(0, 1)), node("b", gpus=(2, 3))])
    assert finding.severity is Severity.WARNING


def test_two_machines_or_two_containers_are_not_one():
    # another boot: another machine; the same boot and another hostname: containers of one kernel
    assert check_one_machine_twice([node("a"), node("b", boot="other")]) == []
    assert check_one_machine_twice([node("a"), node("b", hostname="pod-b")]) == []
    # a node that did not answer, or an older probe without a boot id: nothing to compare
    assert (
        check_one_machine_twice([node("a", boot=""), node("b", boot=""), ProbeResult("c", error="down")])
        == []
    )


def test_the_probe_reads_this_boots_id():
    facts = probe_node()
    assert facts.boot_id == Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def test_preflight_names_localhost_and_its_address_as_one_machine(tmp_path, capsys):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    cli.main(["preflight", "--hosts", str(hostfile), "--runs", str(tmp_path / "runs"), "--json"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    (same,) = [f for f in findings if f["id"] == "one-machine-twice"]
    assert "'localhost' and '127.0.0.1' are one machine" in same["message"]
