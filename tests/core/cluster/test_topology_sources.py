"""Topology detection over recorded environments of each platform, the ambiguous ones included;
hostfiles and SLURM host lists; host-name validation."""

from __future__ import annotations

import pytest

from taehv_console.core.cluster.hosts import (
    HostfileError,
    InvalidHostError,
    expand_slurm_hostlist,
    parse_hostfile,
    validate_host,
)
from taehv_console.core.cluster.platform import TopologyError, detect_topology
from taehv_console.core.models import TopologySource as S

# Environments as the platforms set them (values from their docs / real pods), minus the noise.
TORCHRUN_RANK_11 = {
    "RANK": "11",
    "LOCAL_RANK": "3",
    "WORLD_SIZE": "16",
    "LOCAL_WORLD_SIZE": "8",
    "GROUP_RANK": "1",
    "ROLE_RANK": "11",
    "MASTER_ADDR": "gpu01",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "none",
}
ACCELERATE_NO_LOCAL_WORLD = {
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "MASTER_ADDR": "10.0.0.2",
    "MASTER_PORT": "29501",
    "ACCELERATE_MIXED_PRECISION": "bf16",
}
PAI_DLC_WORKER = {
    "MASTER_ADDR": "dlc1a2b3c4d5e6f-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "3",
    "RANK": "2",
    "NPROC_PER_NODE": "8",
    "KUBERNETES_SERVICE_HOST": "172.16.0.1",
}
KUBEFLOW_WORKER = {
    "MASTER_ADDR": "taehv-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "4",
    "RANK": "1",
    "PET_NNODES": "4",
    "PET_NPROC_PER_NODE": "8",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "taehv-master-0",
    "PET_MASTER_PORT": "23456",
    "KUBERNETES_SERVICE_HOST": "172.16.0.1",
}
UNMARKED_NODE_ENV = {"MASTER_ADDR": "head", "MASTER_PORT": "6000", "WORLD_SIZE": "2", "RANK": "1"}
# A rank process torchrun started inside a PAI-DLC pod: per-process variables win over the pod's.
PAI_POD_WITH_TORCHRUN_RANK = {
    **PAI_DLC_WORKER,
    "RANK": "19",
    "LOCAL_RANK": "3",
    "WORLD_SIZE": "24",
    "LOCAL_WORLD_SIZE": "8",
    "GROUP_RANK": "2",
}
INDEXED_JOB = {"JOB_COMPLETION_INDEX": "2", "HOSTNAME": "taehv-train-2", "NNODES": "4"}
INDEXED_JOB_MASTER = {
    "JOB_COMPLETION_INDEX": "0",
    "HOSTNAME": "taehv-train-0",
    "NNODES": "2",
    "MASTER_ADDR": "taehv-train-0.taehv-svc",
    "MASTER_PORT": "29400",
}
SLURM_NODE = {
    "SLURM_JOB_ID": "81234",
    "SLURM_JOB_NODELIST": "gpu[01-04,07]",
    "SLURM_NNODES": "5",
    "SLURM_NODEID": "3",
    "SLURM_GPUS_ON_NODE": "8",
    "SLURM_JOB_PARTITION": "h100",
}


@pytest.mark.parametrize(
    "env, local_gpus, source, nodes, rank, ppn, master",
    [
        (TORCHRUN_RANK_11, 8, S.LAUNCHER_ENV, 2, 1, 8, ("gpu01", 29500)),
        (ACCELERATE_NO_LOCAL_WORLD, 4, S.LAUNCHER_ENV, 2, 1, 4, ("10.0.0.2", 29501)),
        (PAI_DLC_WORKER, 8, S.PAI_DLC, 3, 2, 8, ("dlc1a2b3c4d5e6f-master-0", 23456)),
        (KUBEFLOW_WORKER, 8, S.KUBEFLOW, 4, 1, 8, ("taehv-master-0", 23456)),
        (UNMARKED_NODE_ENV, 2, S.NODE_ENV, 2, 1, 2, ("head", 6000)),
        (PAI_POD_WITH_TORCHRUN_RANK, 8, S.LAUNCHER_ENV, 3, 2, 8, ("dlc1a2b3c4d5e6f-master-0", 23456)),
        (INDEXED_JOB, 8, S.K8S_INDEXED_JOB, 4, 2, 8, ("taehv-train-0", 29500)),
        (INDEXED_JOB_MASTER, 8, S.K8S_INDEXED_JOB, 2, 0, 8, ("taehv-train-0.taehv-svc", 29400)),
        (SLURM_NODE, None, S.SLURM, 5, 3, 8, ("gpu01", 29500)),
        ({"HOME": "/root", "PATH": "/usr/bin"}, 8, S.LOCAL, 1, 0, 8, ("127.0.0.1", 29500)),
        ({}, None, S.LOCAL, 1, 0, None, ("127.0.0.1", 29500)),
    ],
)
def test_each_platform_env(env, local_gpus, source, nodes, rank, ppn, master):
    t = detect_topology(env, local_gpus=local_gpus)
    assert (t.source, t.node_count, t.this_node_rank, t.processes_per_node) == (source, nodes, rank, ppn)
    assert (t.master_addr, t.master_port) == master
    assert t.detail  # every topology says where it came from


def test_node_level_env_is_not_read_as_processes():
    # WORLD_SIZE=3 in a PAI pod means 3 nodes (24 processes with 8 GPUs each), not 3 processes.
    t = detect_topology(PAI_DLC_WORKER, local_gpus=8)
    assert t.node_count * t.processes_per_node == 24
    assert any("not processes" in n for n in t.notes)


def test_unmarked_node_env_says_platform_not_identified():
    t = detect_topology(UNMARKED_NODE_ENV, local_gpus=2)
    assert any("not identified" in n for n in t.notes)


def test_pai_nproc_disagreeing_with_local_gpus_is_noted():
    t = detect_topology(PAI_DLC_WORKER, local_gpus=4)
    assert t.processes_per_node == 8
    assert any("sees 4 GPU" in n for n in t.notes)


def test_slurm_hosts_listed_in_order_with_gpu_slots_and_count_mismatch_noted():
    t = detect_topology(SLURM_NODE)
    assert t.hosts == ("gpu01", "gpu02", "gpu03", "gpu04", "gpu07")
    assert all(n.slots == 8 for n in t.nodes)
    assert [n.machine_rank for n in t.nodes] == [0, 1, 2, 3, 4]
    t2 = detect_topology({**SLURM_NODE, "SLURM_NNODES": "6"})
    assert any("SLURM_NNODES=6" in n for n in t2.notes)


def test_hostfile_wins_over_every_env(tmp_path):
    hf = tmp_path / "hostfile"
    hf.write_text("# two nodes\nnode-a slots=8\n\nnode-b slots=8  # second\n")
    t = detect_topology({**TORCHRUN_RANK_11, **SLURM_NODE}, hf)
    assert t.source is S.HOSTFILE and t.hosts == ("node-a", "node-b") and t.master_addr == "node-a"
    assert t.processes_per_node == 8 and t.uses_ssh


@pytest.mark.parametrize(
    "env, words",
    [
        ({"RANK": "x", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, "RANK='x'"),
        ({"RANK": "4", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, "not below WORLD_SIZE"),
        ({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "8"}, "not a multiple"),
        ({"RANK": "1", "WORLD_SIZE": "2"}, "MASTER_ADDR is not"),
        ({**UNMARKED_NODE_ENV, "MASTER_ADDR": "-oProxyCommand=sh"}, "command-line option"),
        ({**UNMARKED_NODE_ENV, "MASTER_PORT": "70000"}, "not a TCP port"),
        ({"JOB_COMPLETION_INDEX": "1", "HOSTNAME": "job-1"}, "NNODES"),
        ({"JOB_COMPLETION_INDEX": "1", "NNODES": "2", "HOSTNAME": "weird"}, "MASTER_ADDR"),
        ({"SLURM_JOB_NODELIST": "gpu[01-"}, "unbalanced"),
        ({"SLURM_JOB_NODELIST": "gpu[05-02]"}, "backwards"),
    ],
)
def test_bad_env_is_an_error_naming_the_variable(env, words):
    with pytest.raises(TopologyError, match=words.replace("[", r"\[").replace("(", r"\(")):
        detect_topology(env, local_gpus=8)


@pytest.mark.parametrize(
    "expr, hosts",
    [
        ("gpu[01-04,07]", ("gpu01", "gpu02", "gpu03", "gpu04", "gpu07")),
        ("a[1-2]-ib,b3", ("a1-ib", "a2-ib", "b3")),
        ("r[1-2]n[08-10]", ("r1n08", "r1n09", "r1n10", "r2n08", "r2n09", "r2n10")),
        ("single", ("single",)),
        ("x[9-11]", ("x9", "x10", "x11")),
    ],
)
def test_slurm_hostlist_expansion(expr, hosts):
    assert expand_slurm_hostlist(expr) == hosts


@pytest.mark.parametrize("name", ["gpu01", "node-7.cluster.local", "10.0.0.12", "fe80::1", "tnode_2"])
def test_plain_host_names_pass(name):
    assert validate_host(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "-oProxyCommand=touch /tmp/x",
        "-p",
        "$(touch /tmp/x)",
        "`touch /tmp/x`",
        "a;touch /tmp/x",
        "a\ntouch /tmp/x",
        "a b",
        "a|b",
        "a&b",
        "a>b",
        "user@host",
        "",
        "a" * 300,
        "näme",
    ],
)
def test_hostile_or_odd_host_names_refused(name):
    with pytest.raises(InvalidHostError):
        validate_host(name)


def test_hostfile_errors_name_the_line(tmp_path):
    with pytest.raises(HostfileError, match="hf:3: host 'a' is listed twice"):
        parse_hostfile("a slots=1\nb slots=1\na slots=2\n", "hf")
    with pytest.raises(HostfileError, match="hf:1: slots must be"):
        parse_hostfile("a slots=0\n", "hf")
    with pytest.raises(HostfileError, match="hf:2: expected 'host slots=N'"):
        parse_hostfile("a\nb gpus=8\n", "hf")
    with pytest.raises(HostfileError, match=r"hf:1: .*command-line option"):
        parse_hostfile("-oProxyCommand=touch slots=1\n", "hf")
    with pytest.raises(HostfileError, match="no hosts"):
        parse_hostfile("# nothing\n\n", "hf")


def test_hostfile_without_slots_leaves_them_to_the_node():
    entries = parse_hostfile("a\nb slots=4\n")
    assert [(e.host, e.slots, e.line) for e in entries] == [("a", None, 1), ("b", 4, 2)]
