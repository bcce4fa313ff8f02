"""core/flow on real parts: which run is live (one definition, asked of the real launcher
processes), and preflight choosing the rendezvous port without touching the caller's options."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from taehv_console.core.flow.config import ChosenConfig
from taehv_console.core.flow.detect import detect
from taehv_console.core.flow.options import FlowOptions
from taehv_console.core.flow.preflight import master_port, preflight
from taehv_console.core.flow.runs import find_live_run, list_run_entries
from taehv_console.core.models import BackendKind, TopologySource
from taehv_console.core.plan.presets import load_preset
from tests.core.run.conftest import make_run


def test_a_run_is_live_while_its_launchers_run_and_not_after(launch_fake, pool, tmp_path):
    runs = str(tmp_path / "runs")
    make_run(tmp_path / "runs")  # created, never started: not live
    ctrl = launch_fake(nodes=2, step_s=0.2)
    entries = {e.run_id: e for e in list_run_entries(runs, pool)}
    assert entries[ctrl.run.run_id].live and entries[ctrl.run.run_id].phase == "running"
    assert [e.live for e in entries.values()].count(True) == 1
    live = find_live_run(runs, pool)
    assert live is not None and live.run_id == ctrl.run.run_id
    assert find_live_run(runs, pool, hosts=("localhost", "localhost")) == live
    assert find_live_run(runs, pool, hosts=("node-a", "node-b")) is None  # another cluster's run
    ctrl.stop(grace_s=5)
    assert ctrl.state.phase.ended
    assert find_live_run(runs, pool) is None
    assert not any(e.live for e in list_run_entries(runs, pool))


def test_preflight_picks_a_free_port_and_returns_it_leaving_the_options_alone(pool, tmp_path):
    options = FlowOptions(runs=str(tmp_path / "runs"), preset="cpu-smoke", data=str(tmp_path))
    found = detect(options)
    assert found.topology.source is TopologySource.LOCAL
    with socket.socket() as busy:  # someone else's rendezvous on the topology's port
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        topology = dataclasses.replace(found.topology, master_port=taken)
        chosen = ChosenConfig(load_preset("cpu-smoke").config, "preset cpu-smoke")
        result = preflight(options, topology, found.probes, chosen, pool)
        assert result.master_port != taken and taken < result.master_port < taken + 50
        assert result.backend is BackendKind.LOCAL
        assert options.master_port is None  # frozen, and nothing tried to write the choice back
        with pytest.raises(dataclasses.FrozenInstanceError):
            options.master_port = 1  # type: ignore[misc]
        # an explicit --master-port is used as given (preflight then reports it busy)
        assert master_port(dataclasses.replace(options, master_port=taken), topology, pool) == taken


def test_spare_hosts_are_read_from_their_hostfile_and_refused_where_they_cannot_serve(tmp_path):
    from taehv_console.core.cluster.hosts import HostfileError
    from taehv_console.core.flow.detect import spare_hosts

    hosts, spares = tmp_path / "hostfile", tmp_path / "spares"
    hosts.write_text("n1 slots=2\nn2 slots=2\n")
    spares.write_text("s1 slots=2\n# a comment\ns2\n")
    assert spare_hosts(FlowOptions(hosts=str(hosts), spares=str(spares))) == ("s1", "s2")
    assert spare_hosts(FlowOptions(hosts=str(hosts))) == ()
    with pytest.raises(HostfileError, match="give --hosts too"):
        spare_hosts(FlowOptions(spares=str(spares)))
    spares.write_text("s1\nn2\n")
    with pytest.raises(HostfileError, match="n2 is also in --hosts"):
        spare_hosts(FlowOptions(hosts=str(hosts), spares=str(spares)))
    spares.write_text("-oProxyCommand=evil\n")
    with pytest.raises((HostfileError, ValueError), match="ProxyCommand|host"):
        spare_hosts(FlowOptions(hosts=str(hosts), spares=str(spares)))
