"""Xid lines from the kernel log as hardware evidence (core/watch/kmsg.py): records in /dev/kmsg's
format parsed; a hardware Xid named against its node, an application's Xid not; and the real agent
process reading the real /dev/kmsg of this machine, into which the test writes an Xid line the way
NVIDIA's driver words it. Writing to /dev/kmsg needs root, and is done only on a machine without an
NVIDIA GPU: on a GPU node, a planted Xid could alarm the node's own monitoring."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from taehv_console.core.watch import kmsg
from taehv_console.core.watch.hardware import hardware_evidence
from taehv_console.core.watch.nodeline import parse_sample
from tests.core.watch.conftest import agent_line, nvml_fixture
from tests.core.watch.test_hardware import node, sample, view

# records as /dev/kmsg gives them ("prio,seq,usec,flags;message"), the messages worded as the
# driver's (NVIDIA's Xid catalogue and the driver's own format: "NVRM: Xid (PCI:dom:bus:dev): code, ...")
RECORDS = [
    "6,1201,59137220567,-;EXT4-fs (vda): re-mounted. Quota mode: none.\n",
    (
        "3,1202,59140011212,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=2417, name=python3, Graphics Exception: "
        "ESR 0x50da30=0x102000e 0x50da34=0x0 0x50da28=0x0 0x50da2c=0x0\n"
    ),
    "3,1203,59141977003,-;NVRM: Xid (PCI:0000:86:00): 79, pid=2417, name=python3, GPU has fallen off the bus.\n",
    "4,1204,59141977101,-;NVRM: GPU 0000:86:00.0: GPU has fallen off the bus.\n",
    (
        "3,1205,59150000000,-;NVRM: Xid (PCI:0000:5e:00): 48, pid=2420, name=python3, An uncorrectable "
        "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n"
    ),
]


def test_records_in_the_kernel_logs_format_give_the_xid_events():
    events = kmsg.xid_events(RECORDS)
    assert [(e["code"], e["pci"], e["seq"]) for e in events] == [
        (13, "0000:3b:00", 1202),
        (79, "0000:86:00", 1203),
        (48, "0000:5e:00", 1205),
    ]
    assert events[1]["text"] == "pid=2417, name=python3, GPU has fallen off the bus."
    assert kmsg.parse_record("NVRM: Xid (PCI:0000:3b:00.0): 94, pid=7, Contained ECC error.")["code"] == 94


def _with_xids(events: list[dict]) -> dict:
    line = json.loads(agent_line("agent_line_h100_node2.json"))
    line.update(nvml=nvml_fixture("h100x8_training.json"), xid={"ok": True, "reason": "", "events": events})
    return line


def test_a_hardware_xid_is_evidence_against_its_node_and_an_applications_xid_is_not():
    healthy = sample(nvml_fixture("h100x8_training.json"), "gpu-node-1")
    app_only = parse_sample(json.dumps(_with_xids(kmsg.xid_events(RECORDS[:2]))))
    bad = parse_sample(json.dumps(_with_xids(kmsg.xid_events(RECORDS))))
    assert [x.code for x in bad.xids] == [13, 79, 48] and bad.xid_reason == ""
    v = view(node("gpu-node-1", healthy), node("gpu-node-2", app_only), node("gpu-node-3", bad))
    assert hardware_evidence(v) == {
        "gpu-node-3": "Xid 79 on the GPU at PCI 0000:86:00: GPU has fallen off the bus (kernel log); "
        "Xid 48 on the GPU at PCI 0000:5e:00: double-bit ECC error (kernel log)"
    }


def test_an_older_agents_line_without_xids_parses_and_a_reader_that_cannot_open_says_why(tmp_path):
    s = parse_sample(agent_line("agent_line_h100_node2.json"))
    assert s.xids == () and s.xid_reason == ""
    reader = kmsg.XidReader(str(tmp_path / "no-such-log"))
    assert not reader.ok and "kernel log not readable" in reader.reason and "No such file" in reader.reason
    assert reader.sample() == {"ok": False, "reason": reader.reason, "events": []}


def _has_nvidia_gpu() -> bool:
    return Path("/dev/nvidia0").exists() or Path("/proc/driver/nvidia").exists()


def _kmsg_writable() -> bool:
    try:
        fd = os.open(kmsg.KMSG, os.O_WRONLY)
    except OSError:
        return False
    os.close(fd)
    return True


@pytest.mark.skipif(_has_nvidia_gpu(), reason="an NVIDIA GPU is here: no Xid is planted in its kernel log")
@pytest.mark.skipif(not _kmsg_writable(), reason="/dev/kmsg is not writable here (root is needed)")
def test_the_agent_reads_an_xid_from_the_real_kernel_log_and_only_from_its_own_start():
    tag = f"taehv-test-{os.getpid()}"

    def plant(code: int, what: str) -> None:
        with open(kmsg.KMSG, "w") as f:  # the kernel adds its own record header
            f.write(f"<3>NVRM: Xid (PCI:0000:86:00): {code}, pid={os.getpid()}, name={tag}, {what}\n")

    plant(79, "GPU has fallen off the bus. (before the agent: not its run's)")
    proc = subprocess.Popen(
        [sys.executable, "-m", "taehv_console.core.watch.agent", "--interval", "0.2", "--no-nvml"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first = parse_sample(proc.stdout.readline())
        assert first.xid_reason == "" and first.xids == ()
        plant(48, "An uncorrectable double bit error (DBE) has been detected on GPU.")
        deadline = time.monotonic() + 20
        s = first
        while not s.xids and time.monotonic() < deadline:
            s = parse_sample(proc.stdout.readline())
        assert [(x.code, x.pci) for x in s.xids] == [(48, "0000:86:00")], s.xids
        assert tag in s.xids[0].text
        # this machine shows no GPU (--no-nvml): an Xid is no evidence against a node whose run has
        # none (a CPU run's watch beside this test reads the same kernel log). The node seen with
        # 8 GPUs at its first sample, and none now (NVML gone, as after an Xid 79), is blamed
        assert hardware_evidence(view(node(s.host, s))) == {}
        evidence = hardware_evidence(view(node(s.host, s)), {s.host: 8})
        assert evidence == {
            s.host: "0 of 8 GPUs left since the first sample (NVML disabled (--no-nvml)); "
            "Xid 48 on the GPU at PCI 0000:86:00: double-bit ECC error (kernel log)"
        }
        # every later sample still carries it: the evidence does not vanish with the next line
        assert parse_sample(proc.stdout.readline()).xids == s.xids
    finally:
        proc.stdin.close()
        proc.wait(10)
