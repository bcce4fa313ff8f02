"""Command-line options shared by several commands (SSH, the headless flow's launch options) and
their translation into core's typed values: below the CLI nothing sees an argparse Namespace."""

from __future__ import annotations

import argparse

from taehv_console.core.cluster.ssh import SshSettings
from taehv_console.core.flow.options import FlowOptions, parse_env
from taehv_console.core.models import BackendKind

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def add_ssh_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("SSH")
    g.add_argument(
        "--ssh-config", metavar="FILE", help="ssh client config (default ~/.ssh/config, $TAEHV_SSH_CONFIG)"
    )
    g.add_argument(
        "--known-hosts",
        metavar="FILE",
        help="known_hosts file (default ~/.ssh/known_hosts, $TAEHV_KNOWN_HOSTS)",
    )
    g.add_argument(
        "--python",
        metavar="PATH",
        help="the nodes' python with taehv-console installed (default: this console's, $TAEHV_REMOTE_PYTHON)",
    )
    g.add_argument(
        "--connect-timeout", type=float, metavar="S", help="seconds to connect to a node (default 10)"
    )
    g.add_argument("--parallel", type=int, metavar="N", help="nodes contacted at once (default 64)")


def ssh_settings(args: argparse.Namespace) -> SshSettings:
    return SshSettings.from_env(
        config_path=getattr(args, "ssh_config", None),
        known_hosts_path=getattr(args, "known_hosts", None),
        python=getattr(args, "python", None),
        connect_timeout_s=getattr(args, "connect_timeout", None),
        max_parallel=getattr(args, "parallel", None),
    )


def add_launch_options(parser: argparse.ArgumentParser) -> None:
    """Options of the headless flow (also shown in `taehv-console --help`, and read by the TUI)."""
    g = parser.add_argument_group("headless run (--no-tui)")
    g.add_argument(
        "--hosts", metavar="FILE", help="DeepSpeed hostfile ('host slots=N' per line): launch over SSH"
    )
    g.add_argument(
        "--preset",
        default="auto",
        metavar="NAME|PATH|auto",
        help="preset, or a run's run.toml (a platform pod's run); default auto",
    )
    g.add_argument(
        "--data",
        metavar="DIR",
        help="data source (sets data.source); without it and without GPUs "
        "the cpu-smoke preset trains on generated clips",
    )
    g.add_argument(
        "--runs", metavar="DIR", default="runs", help="runs directory on shared storage (default ./runs)"
    )
    g.add_argument(
        "--run", metavar="RUN", help="an existing run directory or id: attach if live, else launch it"
    )
    g.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. optim.max_steps=100; repeatable",
    )
    g.add_argument(
        "--env",
        dest="launch_env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for every node's launcher; repeatable",
    )
    g.add_argument(
        "--master-port", type=int, metavar="PORT", help="rendezvous port on node 0 (default: a free one)"
    )
    g.add_argument(
        "--backend",
        choices=("auto", *(k.value for k in BackendKind)),
        default="auto",
        help="how nodes are started (auto: from the detected topology)",
    )
    g.add_argument(
        "--grace", type=float, metavar="S", help="seconds a stop waits for the checkpoint (default 120)"
    )
    g.add_argument("--json", action="store_true", help="stream JSON lines instead of a progress display")


def flow_options(args: argparse.Namespace) -> FlowOptions:
    """The flow's options from whichever of them this command line has. EnvError for a bad --env."""
    backend = getattr(args, "backend", "auto") or "auto"
    return FlowOptions(
        hosts=getattr(args, "hosts", None) or None,
        preset=getattr(args, "preset", None) or "auto",
        data=getattr(args, "data", None) or None,
        runs=getattr(args, "runs", None) or "runs",
        run=getattr(args, "run", None) or None,
        overrides=tuple(getattr(args, "overrides", None) or ()),
        env=parse_env(list(getattr(args, "launch_env", None) or [])),
        master_port=getattr(args, "master_port", None),
        backend=None if backend == "auto" else BackendKind(backend),
        grace_s=getattr(args, "grace", None),
        ssh=ssh_settings(args),
    )
