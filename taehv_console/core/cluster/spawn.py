"""Start a process detached from the caller (own session, stdin from /dev/null, output to a log) and
report its pid, process group and identity (start time, boot id); signal a group so started, its
leader proven by that identity first; list a process group. Run on a node as
`python -m taehv_console.core.cluster.spawn start|signal|pids ...`, each printing one JSON object.

A dropped SSH channel does not stop a process started without a pty, and a process in its own
session is never hit by the caller's job control: the console records the pgid and stops the run
by signalling that group, never by name.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def start_detached(
    argv: Sequence[str], log_path: str, *, cwd: str | None = None, env: Mapping[str, str] | None = None
) -> dict:
    """Start argv in a new session; return {"pid", "pgid", "sid", "host", "log", "start_ticks",
    "boot_id"}. Does not wait. The start time is read here, at spawn, from the child's /proc entry
    (it exists until someone reaps the child, and nobody has yet): the identity every later signal
    to this group is checked against, known before the process could write anything itself."""
    log = Path(log_path).expanduser()
    log.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ)
    full_env.update(env or {})
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=full_env,
            start_new_session=True,
            close_fds=True,
        )
    # start_new_session makes the child a session and group leader: pgid == sid == pid. Asked
    # rather than assumed, so a surprise (a wrapper that forks) shows up in state.json.
    try:
        pgid, sid = os.getpgid(proc.pid), os.getsid(proc.pid)
    except ProcessLookupError:  # it already exited and was reaped by nobody yet: still its own group
        pgid = sid = proc.pid
    entry = read_proc_one(proc.pid)
    return {
        "pid": proc.pid,
        "pgid": pgid,
        "sid": sid,
        "host": socket.gethostname(),
        "log": str(log),
        "start_ticks": entry[4] if entry else None,
        "boot_id": boot_id(),
    }


def boot_id() -> str:
    """This boot's id: start times in /proc count from boot, so they identify a process only
    together with it."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


ProcEntry = tuple[int, int, int, str, int]  # (ppid, pgid, sid, state, start_ticks)


def _parse_stat(stat: str) -> ProcEntry | None:
    # comm (field 2) may hold spaces and parentheses: the fields restart after the last ')'
    rest = stat[stat.rfind(")") + 2 :].split()
    if len(rest) < 20:
        return None
    return int(rest[1]), int(rest[2]), int(rest[3]), rest[0], int(rest[19])


def read_proc_one(pid: int, proc_root: str = "/proc") -> ProcEntry | None:
    """(ppid, pgid, sid, state, start_ticks) of one process, None when it is gone."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat")) as f:
            return _parse_stat(f.read())
    except OSError:
        return None


def read_proc(proc_root: str = "/proc") -> dict[int, ProcEntry]:
    """pid -> (ppid, pgid, sid, state, start_ticks) for every process visible in /proc."""
    table = {}
    for entry in os.listdir(proc_root):
        if entry.isdigit():
            info = read_proc_one(int(entry), proc_root)  # None: exited while we looked
            if info is not None:
                table[int(entry)] = info
    return table


def group_pids(pgid: int, proc_root: str = "/proc") -> list[int]:
    """Live (non-zombie) processes whose process group is `pgid`, read from /proc."""
    return sorted(
        pid for pid, (_pp, g, _sid, state, _st) in read_proc(proc_root).items() if g == pgid and state != "Z"
    )


def unproven(pgid: int, start_ticks: int | None, boot: str = "") -> str:
    """Why the group `pgid` cannot be proven the one `start_detached` started ("" when it can): its
    leader alive, with the start time (`start_ticks`) and boot id (`boot`, "" for not recorded)
    read at spawn. A pgid alone may by now name someone else's group."""
    if pgid <= 1:
        # killpg(0) is our own group and killpg(1) init's: never what a caller meant.
        return f"refusing pgid {pgid}"
    if start_ticks is None:
        return f"refusing pgid {pgid}: no start time of its leader to prove it"
    here = boot_id()
    if boot and here and boot != here:
        return f"pgid {pgid} was recorded on another boot (the node has restarted since)"
    members = group_pids(pgid)
    if not members:
        # Zombies still count for killpg (a container's init may never reap them), but nothing
        # is left that a signal could stop: report it as gone.
        return "no live process in the group"
    leader = read_proc_one(pgid)
    if leader is None or leader[3] == "Z" or leader[1] != pgid:
        return (
            f"refusing pgid {pgid}: its leader is gone, so nothing proves pids {members[:5]} "
            "are the group that was started"
        )
    if leader[4] != start_ticks:
        return (
            f"refusing pgid {pgid}: pid {pgid} is another process (started at tick "
            f"{leader[4]}, the recorded one at tick {start_ticks})"
        )
    return ""


def proven_pids(pgid: int, start_ticks: int | None, boot: str = "") -> dict:
    """The live processes of a group `start_detached` started, once its leader is proven (see
    `unproven`); none, and why, otherwise. {"pgid", "pids", "error"}."""
    why = unproven(pgid, start_ticks, boot)
    return {"pgid": pgid, "pids": [] if why else group_pids(pgid), "error": why}


def signal_group(pgid: int, sig: int | str, start_ticks: int | None, boot: str = "") -> dict:
    """Send a signal to a process group started by `start_detached`, once its leader is proven the
    one that was started (`unproven`). Anything less fails closed, nothing sent.
    {"pgid", "signal", "sent", "error"}."""
    try:
        signum = (
            sig if isinstance(sig, int) else getattr(signal, sig if sig.startswith("SIG") else f"SIG{sig}")
        )
        name = signal.Signals(signum).name
    except (AttributeError, ValueError):
        return {"pgid": pgid, "signal": str(sig), "sent": False, "error": f"no signal {sig!r}"}

    def refused(why: str) -> dict:
        return {"pgid": pgid, "signal": name, "sent": False, "error": why}

    why = unproven(pgid, start_ticks, boot)
    if why:
        return refused(why)
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return refused("no such process group")
    except PermissionError as err:
        return refused(str(err))
    return {"pgid": pgid, "signal": name, "sent": True, "error": ""}


def _parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY.fullmatch(key):
            raise SystemExit(f"--env expects KEY=VALUE with a plain KEY, got {item!r}")
        env[key] = value
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m taehv_console.core.cluster.spawn")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("start", help="start a detached process; print pid and pgid")
    p.add_argument("--log", required=True)
    p.add_argument("--cwd")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("command", nargs=argparse.REMAINDER)
    p = sub.add_parser("signal", help="signal a process group it started, its leader proven first")
    p.add_argument("--pgid", type=int, required=True)
    p.add_argument(
        "--start-ticks", type=int, required=True, help="the leader's start time, as `start` reported it"
    )
    p.add_argument("--boot-id", default="", help="the node's boot id, as `start` reported it")
    p.add_argument("--signal", default="TERM")
    p = sub.add_parser("pids", help="list the live processes of a group it started, its leader proven first")
    p.add_argument("--pgid", type=int, required=True)
    p.add_argument(
        "--start-ticks", type=int, required=True, help="the leader's start time, as `start` reported it"
    )
    p.add_argument("--boot-id", default="", help="the node's boot id, as `start` reported it")
    args = parser.parse_args(argv)
    if args.action == "start":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("start needs a command after --")
        try:
            out = start_detached(command, args.log, cwd=args.cwd, env=_parse_env(args.env))
        except OSError as err:  # the program is missing, the cwd or log is not writable
            print(json.dumps({"error": f"{type(err).__name__}: {err}"}))
            return 127
    elif args.action == "signal":
        out = signal_group(args.pgid, args.signal, args.start_ticks, args.boot_id)
    else:
        out = proven_pids(args.pgid, args.start_ticks, args.boot_id)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
