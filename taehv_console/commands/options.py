"""The command line's shared options, defined once, and their translation into core's typed values:
below the CLI nothing sees an argparse Namespace.

Every top-level option is in SHARED, and a command that takes one of them adds the same entry
(add_option, add_ssh_options): the same flag, dest, type and meaning everywhere. Such an option may
stand before or after the command's name: `taehv-console --runs DIR status` is `taehv-console status
--runs DIR`. argparse alone drops the first (a subcommand's defaults overwrite what the top level
parsed), so here argparse keeps no default: the top level stores what it reads under `before_<dest>`,
the command under `<dest>`, and `settle` decides once the whole line is read: given after the
command, that value; else given before it, that one; else the command's default. A repeatable option
(--set, --env) collects from both places. An option given before a command that does not take it is
a usage error, not silently ignored.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

from taehv_console.core.cluster.ssh import SshSettings
from taehv_console.core.flow.options import FlowOptions, parse_env, repeated_keys
from taehv_console.core.models import BackendKind
from taehv_console.core.values import InputError, checked_float, checked_int, checked_port

BEFORE = "before_"  # the top level's dest prefix: what was given before the command's name
SPEC = "_options"  # a parser's default: {dest: (default, required, name)} of the options it shares
UNSET: Any = object()  # an option nobody gave


@dataclasses.dataclass(frozen=True)
class Option:
    """One option as every command that takes it spells it."""

    flag: str
    dest: str
    help: str
    default: Any = None  # the top level's; a command may have its own (add_option)
    metavar: str | None = None
    type: Callable[[str], Any] | None = None
    action: str | None = None  # None (a value), "store_true" or "append"
    choices: tuple[str, ...] | None = None

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"default": argparse.SUPPRESS}  # settle() fills defaults in
        for key in ("metavar", "type", "action", "choices"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def arg_type(name: str, check: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a core check: its InputError becomes argparse's own error (exit 2,
    the usage line, and the check's message, which names the range)."""

    def parse(text: str) -> Any:
        try:
            return check(text)
        except InputError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = name  # argparse names the type in some messages
    return parse


# the types of the options that take a number: checked where they enter (core/values.py)
PORT = arg_type("port", lambda t: checked_port(t, "port"))
COUNT = arg_type("count", lambda t: checked_int(t, "count", 1))  # 1 or more
LIMIT = arg_type("limit", lambda t: checked_int(t, "limit", 0))  # 0 or more (0: no limit)
SECONDS = arg_type("seconds", lambda t: checked_float(t, "seconds"))  # more than 0
GRACE = arg_type("grace", lambda t: checked_float(t, "seconds", allow_minimum=True))  # 0 or more
FRACTION = arg_type("fraction", lambda t: checked_float(t, "fraction", 0.0, 1.0))  # (0, 1]
AMOUNT = arg_type("amount", lambda t: checked_float(t, "amount", allow_minimum=True))  # 0 or more
POSITIVE = arg_type("positive", lambda t: checked_float(t, "value"))  # more than 0

LAUNCH, SSH = "headless run (--no-tui)", "SSH"
SHARED: dict[str, Option] = {
    o.dest: o
    for o in (
        Option("--no-tui", "no_tui", "run the whole flow headless (containers, CI): detect, preflight, "
               "launch or attach, progress until the run ends", False, action="store_true"),
        Option("--hosts", "hosts", "DeepSpeed hostfile ('host slots=N' per line)", metavar="FILE"),
        Option("--spares", "spares", "hostfile of spare hosts: one takes the place of a node the "
               "console leaves out after failures (with --hosts)", metavar="FILE"),
        Option("--preset", "preset", "preset name, .toml path, or a run's run.toml (a platform pod's "
               "run); default auto", "auto", metavar="NAME|PATH|auto"),
        Option("--data", "data", "data source (sets data.source); without it and without GPUs the "
               "cpu-smoke preset trains on generated clips", metavar="DIR"),
        Option("--runs", "runs", "runs directory on shared storage (default ./runs)", "runs",
               metavar="DIR"),
        Option("--run", "run", "an existing run directory or id: attach if live, else launch it",
               metavar="RUN"),
        Option("--set", "overrides", "override a config value, e.g. optim.max_steps=100; repeatable",
               (), metavar="KEY=VALUE", action="append"),
        Option("--env", "launch_env", "extra environment for every node's launcher; repeatable", (),
               metavar="KEY=VALUE", action="append"),
        Option("--master-port", "master_port", "rendezvous port on node 0 (default: a free one)",
               metavar="PORT", type=PORT),
        Option("--backend", "backend", "how nodes are started (auto: from the detected topology)",
               "auto", choices=("auto", *(k.value for k in BackendKind))),
        Option("--grace", "grace", "seconds a stop waits for the checkpoint before SIGKILL "
               "(default 120)", metavar="S", type=GRACE),
        Option("--json", "json", "JSON instead of text (the flow: JSON lines instead of a progress "
               "display)", False, action="store_true"),
        Option("--ssh-config", "ssh_config", "ssh client config (default ~/.ssh/config, "
               "$TAEHV_SSH_CONFIG)", metavar="FILE"),
        Option("--known-hosts", "known_hosts", "known_hosts file (default ~/.ssh/known_hosts, "
               "$TAEHV_KNOWN_HOSTS)", metavar="FILE"),
        Option("--python", "python", "the nodes' python with taehv-console installed (default: this "
               "console's, $TAEHV_REMOTE_PYTHON)", metavar="PATH"),
        Option("--connect-timeout", "connect_timeout", "seconds to connect to a node (default 10)",
               metavar="S", type=SECONDS),
        Option("--parallel", "parallel", "nodes contacted at once (default 64)", metavar="N",
               type=COUNT),
        Option("--theme", "theme", "console colour theme: dark (default), light, high-contrast, or a "
               "file's name in ~/.config/taehv-console/themes/; NO_COLOR is respected", metavar="NAME"),
    )
}  # fmt: skip
GROUPS = {
    LAUNCH: ("hosts", "spares", "preset", "data", "runs", "run", "overrides", "launch_env", "master_port",
             "backend", "grace", "json"),
    SSH: ("ssh_config", "known_hosts", "python", "connect_timeout", "parallel"),
}  # fmt: skip


def _record(parser: argparse.ArgumentParser, dest: str, default: Any, required: bool, name: str) -> None:
    spec = dict(parser.get_default(SPEC) or {})
    spec[dest] = (default, required, name)
    parser.set_defaults(**{SPEC: spec})


def add_option(
    parser: argparse.ArgumentParser,
    dest: str,
    *,
    default: Any = UNSET,
    required: bool = False,
    help: str | None = None,
    positional: bool = False,
    group: argparse._ArgumentGroup | None = None,
) -> None:
    """Add SHARED[dest] to a command's parser, with this command's default, requiredness and help
    text when they differ. positional: RUN as a positional argument (the commands that take a run)."""
    opt = SHARED[dest]
    where: argparse.ArgumentParser | argparse._ArgumentGroup = group or parser
    name = dest.upper() if positional else opt.flag
    if positional:
        where.add_argument(dest, nargs="?", metavar=dest.upper(), default=argparse.SUPPRESS, help=help)
    else:
        # argparse cannot require it (it may stand before the command's name): settle does
        text = (help or opt.help) + ("; required" if required else "")
        where.add_argument(opt.flag, dest=dest, help=text, **opt.kwargs())
    _record(parser, dest, opt.default if default is UNSET else default, required, name)


def add_ssh_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(SSH)
    for dest in GROUPS[SSH]:
        add_option(parser, dest, group=group)


def add_top_level_options(parser: argparse.ArgumentParser) -> None:
    """Every option of SHARED, before any command's name (the TUI's and --no-tui's options)."""
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    in_group = {dest: groups[name] for name, dests in GROUPS.items() for dest in dests}
    for opt in SHARED.values():
        where = in_group.get(opt.dest, parser)
        # dest = before_<dest>: a command's own parse must not overwrite it (settle merges them)
        where.add_argument(opt.flag, dest=BEFORE + opt.dest, help=opt.help, **opt.kwargs())
        _record(parser, opt.dest, opt.default, False, opt.flag)


def settle(args: argparse.Namespace) -> str | None:
    """Turn the parsed line into one value per option (the module's docstring says how), in place.
    Returns a usage error's message, or None."""
    given = vars(args)
    spec: dict[str, tuple[Any, bool, str]] = given.pop(SPEC, {})
    for dest, opt in SHARED.items():
        before = given.pop(BEFORE + dest, UNSET)
        if dest not in spec:
            if before is not UNSET:
                return f"{opt.flag} is not an option of `{given.get('command')}`"
            continue
        after = given.pop(dest, UNSET)
        default, required, name = spec[dest]
        if opt.action == "append" and before is not UNSET and after is not UNSET:
            value = [*before, *after]
        else:
            value = after if after is not UNSET else before
        if value is UNSET:
            if required:
                return f"the following arguments are required: {name}"
            value = list(default) if isinstance(default, tuple) else default
        given[dest] = value
    return None


def ssh_settings(args: argparse.Namespace) -> SshSettings:
    return SshSettings.from_env(
        config_path=getattr(args, "ssh_config", None),
        known_hosts_path=getattr(args, "known_hosts", None),
        python=getattr(args, "python", None),
        connect_timeout_s=getattr(args, "connect_timeout", None),
        max_parallel=getattr(args, "parallel", None),
    )


def option_warnings(args: argparse.Namespace) -> tuple[str, ...]:
    """What the line gives twice (a --set or --env key, --data over --set data.source): cli.main
    prints each before the command runs, the TUI shows them (FlowOptions.warnings)."""
    return repeated_keys(
        list(getattr(args, "overrides", None) or ()),
        list(getattr(args, "launch_env", None) or ()),
        getattr(args, "data", None) or None,
    )


def flow_options(args: argparse.Namespace) -> FlowOptions:
    """The flow's options from whichever of them this command line has. EnvError for a bad --env."""
    backend = getattr(args, "backend", "auto") or "auto"
    return FlowOptions(
        hosts=getattr(args, "hosts", None) or None,
        spares=getattr(args, "spares", None) or None,
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
        warnings=option_warnings(args),
    )
