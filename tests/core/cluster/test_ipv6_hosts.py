"""IPv6 literals are host addresses like any other (issue 44: '::1' was refused as "too long"):
in a hostfile, --hosts, a master address and ssh-config's HostName, bracketed or not; written
back bracketed where a host:port form needs it; refused, saying why, only where they cannot work
(a zone index: torchrun will not take it as node 0's address)."""

from __future__ import annotations

import socket

import pytest
import yaml

from taehv_console.core.cluster.hosts import HostfileError, parse_hostfile
from taehv_console.core.cluster.nodecheck import port_free
from taehv_console.core.cluster.platform import TopologyError, detect_topology
from taehv_console.core.hostnames import InvalidHostError, host_port, is_local_host, validate_host
from taehv_console.core.models import TopologySource
from taehv_console.core.plan.presets import load_preset
from taehv_console.core.plan.render import RenderOptions, render_accelerate_yaml


@pytest.mark.parametrize(
    "given, address",
    [
        ("::1", "::1"),
        ("[::1]", "::1"),
        ("fd00::0002", "fd00::2"),
        ("2001:DB8::1", "2001:db8::1"),
        ("0:0:0:0:0:0:0:1", "::1"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),
    ],
)
def test_an_ipv6_literal_is_a_host(given, address):
    assert validate_host(given) == address


def test_the_loopback_address_is_this_machine_however_it_is_written():
    assert is_local_host(validate_host("[::1]")) and is_local_host(validate_host("0::1"))


@pytest.mark.parametrize(
    "given, words",
    [
        ("fe80::1%eth0", "zone ('%eth0') cannot be used: torchrun refuses it"),
        ("[::1]:2222", "give the address alone ('::1')"),
        ("node:1", "a ':' belongs only in an IPv6 address"),
        ("::g", "a ':' belongs only in an IPv6 address"),
        ("-::1", "command-line option"),
    ],
)
def test_what_is_not_an_address_says_why(given, words):
    with pytest.raises(InvalidHostError, match="^host .*" + words.replace("(", r"\(").replace(")", r"\)")):
        validate_host(given)


def test_a_hostfile_takes_ipv6_nodes_and_knows_two_spellings_are_one():
    entries = parse_hostfile("::1 slots=2\n[fd00::2] slots=2\n", "hf")
    assert [(e.host, e.slots) for e in entries] == [("::1", 2), ("fd00::2", 2)]
    with pytest.raises(HostfileError, match=r"hf:2: host '::1' is listed twice \(first on line 1\)"):
        parse_hostfile("::1 slots=2\n[0::1] slots=2\n", "hf")


def test_a_hostfile_of_ipv6_nodes_is_a_topology_with_an_ipv6_master(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("fd00::1 slots=8\nfd00::2 slots=8\n")
    t = detect_topology({}, hostfile)
    assert t.source is TopologySource.HOSTFILE and t.master_addr == "fd00::1"
    assert t.hosts == ("fd00::1", "fd00::2")


@pytest.mark.parametrize("address", ["fd00::1", "[fd00::1]"])
def test_a_platform_master_address_may_be_ipv6(address):
    env = {"MASTER_ADDR": address, "MASTER_PORT": "6000", "WORLD_SIZE": "2", "RANK": "1"}
    assert detect_topology(env, local_gpus=8).master_addr == "fd00::1"


def test_a_scoped_master_address_names_the_variable_and_why():
    env = {"MASTER_ADDR": "fe80::1%eth0", "MASTER_PORT": "6000", "WORLD_SIZE": "2", "RANK": "1"}
    with pytest.raises(TopologyError, match="MASTER_ADDR: .*torchrun refuses it"):
        detect_topology(env, local_gpus=8)


def test_launch_files_carry_an_ipv6_master_that_reads_back_as_the_address():
    cfg = load_preset("cpu-smoke").config
    text = render_accelerate_yaml(cfg, 0, RenderOptions(run_dir="/runs/r", main_process_ip="[::1]"))
    assert yaml.safe_load(text)["main_process_ip"] == "::1"


def test_host_port_brackets_ipv6_as_urls_and_torchrun_want_it():
    assert host_port("::1", 29500) == "[::1]:29500"
    assert host_port("10.0.0.1", 22) == "10.0.0.1:22"
    assert host_port("node-1", 22) == "node-1:22"


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this machine")
def test_a_port_held_on_ipv6_alone_is_not_free():
    # the rendezvous store listens on IPv6 and IPv4 alike: preflight's check must see either
    try:
        held = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        held.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        held.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with held:
        held.listen(1)
        assert port_free(held.getsockname()[1])["free"] is False


@pytest.mark.skipif(not socket.has_ipv6, reason="no IPv6 on this machine")
def test_the_bandwidth_check_rendezvous_at_an_ipv6_master():
    # init_method is a URL: tcp://::1:port is no URL torch can read, tcp://[::1]:port is
    from taehv_console.core.cluster.bandwidth import worker

    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        try:
            s.bind(("::1", 0))
        except OSError:
            pytest.skip("no IPv6 loopback here")
        port = s.getsockname()[1]
    result = worker(0, 1, "::1", port, 1024, 1, "gloo", 30.0)
    assert result is None or result.bytes == 1024
