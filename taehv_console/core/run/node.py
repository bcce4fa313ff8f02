"""Runs on each node: the launcher wrapper, and the process-tree tool the console uses to check and
stop a node's share of a run. `python -m taehv_console.core.run.node launch|pids|kill ...`, each
printing one JSON object (pids, kill) or running the launcher (launch).

Why a wrapper: the console starts it detached (own session, pgid recorded in state.json), so
nothing reports the launcher's exit status back. The wrapper writes it to
`logs/node-<i>.status.json` on the shared run directory, together with who it is (pid, process
start time, boot id) so that a reused pid is never taken for the run.

Why a tree and not just the group: torchrun starts every rank in a session of its own, so the
launcher's process group does not hold the ranks. The wrapper makes itself a child subreaper, so
every process the launch starts stays its descendant even when its parent dies first; "the run's
processes on a node" are the launcher's group, everything below it, and the groups those
processes lead. Nothing is ever matched by name.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from taehv_console.core.cluster.spawn import ProcEntry, boot_id, read_proc, read_proc_one

NODE_MODULE_NAME = "taehv_console.core.run.node"  # the wrapper's `-m` (plan/render.py: NODE_MODULE)

PR_SET_CHILD_SUBREAPER = 36
# The run's identity in the environment of everything the console launches (the backends set it
# at spawn; the wrapper, the launcher and the ranks inherit it): /proc/PID/environ shows it.
RUN_ID_ENV = "TAEHV_RUN_ID"

# What the identity check says of a recorded launcher group (`identify`):
OURS = "ours"  # proven the run's: signal it
GONE = "gone"  # nothing of it is left
FOREIGN = "foreign"  # its pid now belongs to a process that is provably not the run's
UNPROVEN = "unproven"  # something lives there, but nothing proves it is the run's: never signalled


# ------------------------------------------------------------------------------------- /proc


def start_ticks(pid: int, proc_root: str = "/proc") -> int | None:
    entry = read_proc_one(pid, proc_root)
    return entry[4] if entry else None


@dataclass(frozen=True)
class Recorded:
    """What the console recorded of a launcher it started (state.json's attempt node): its group,
    the leader's start time and boot id read at spawn, and the run it belongs to."""

    pgid: int
    start_ticks: int | None = None
    boot_id: str = ""
    run_id: str = ""
    node: int | None = None  # machine rank (-1: srun)
    attempt: int | None = None


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, or another user's process (environ is private)
        return None


def _environ(pid: int, proc_root: str) -> dict[str, str] | None:
    raw = _read(os.path.join(proc_root, str(pid), "environ"))
    # empty: a zombie, or a process caught inside its exec before the new environment is laid out
    # (the moment Popen returns): nothing shows whose it is, so it is unread, not "not the run's"
    if not raw:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _cmdline(pid: int, proc_root: str) -> list[str]:
    raw = _read(os.path.join(proc_root, str(pid), "cmdline")) or b""
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _is_runs_wrapper(cmd: list[str], rec: Recorded) -> bool:
    """The node wrapper of this run, node and attempt, as its command line says (a launch made
    before RUN_ID_ENV existed carries no other mark): `-m <this module> launch --status
    .../<run id>/logs/node-<i>.status.json ... --attempt N`."""
    if NODE_MODULE_NAME not in cmd or "launch" not in cmd or "--status" not in cmd:
        return False
    status = cmd[cmd.index("--status") + 1] if cmd.index("--status") + 1 < len(cmd) else ""
    node = "{node}" if rec.node is not None and rec.node < 0 else str(rec.node)
    if not status.endswith(f"/{rec.run_id}/logs/node-{node}.status.json"):
        return False
    attempt = cmd[cmd.index("--attempt") + 1] if "--attempt" in cmd[:-1] else "1"
    return rec.attempt is None or attempt == str(rec.attempt)


def _mark(pid: int, rec: Recorded, proc_root: str) -> str | None:
    """How process `pid` shows it belongs to run `rec.run_id`: "env" (RUN_ID_ENV in its
    environment), "wrapper" (it is the run's node wrapper for this node and attempt), "" (it does
    not: its environment was read and names no such run), None (its environment cannot be read)."""
    env = _environ(pid, proc_root)
    if env is not None and env.get(RUN_ID_ENV) == rec.run_id:
        return "env"
    if _is_runs_wrapper(_cmdline(pid, proc_root), rec):
        return "wrapper"
    return None if env is None else ""


def _what(pid: int, proc_root: str) -> str:
    cmd = " ".join(_cmdline(pid, proc_root))
    return (cmd[:80] + "...") if len(cmd) > 80 else (cmd or "?")


def identify(
    rec: Recorded, table: dict[int, ProcEntry] | None = None, proc_root: str = "/proc"
) -> tuple[str, str]:
    """Whether the group the console recorded is still the run's, checked on the node where it
    lives: (OURS | GONE | FOREIGN | UNPROVEN, why). Fails closed: only OURS is ever signalled.

    OURS needs more than the pid: the leader's start time as recorded at spawn, and the run's
    identity (RUN_ID_ENV in its environment, or the run's own node wrapper command line for a
    launch recorded before it existed). With the leader gone and its group still there (Linux
    never reuses a pid while a group of that id has members), its members must carry the run's
    identity. A console that gives no run id (an old one) is held to the start time alone.

    A process that exits after the table was read shows no environment and no command line (a
    zombie's are empty), which reads as unproven: an unproven answer is checked once more on a
    table read now, where such a process is a zombie or gone (a stop's last look at a launcher
    that was exiting once named it "cannot be read" in the run's attention, CI on a loaded machine)."""
    verdict, why = _identify(rec, read_proc(proc_root) if table is None else table, proc_root)
    if verdict == UNPROVEN:
        verdict, why = _identify(rec, read_proc(proc_root), proc_root)
    return verdict, why


def _identify(rec: Recorded, table: dict[int, ProcEntry], proc_root: str) -> tuple[str, str]:
    pgid = rec.pgid
    here = boot_id()
    if rec.boot_id and here and rec.boot_id != here:
        return GONE, f"the node has restarted since pgid {pgid} was recorded (another boot id)"
    leader = table.get(pgid)
    if leader is not None and leader[3] != "Z":
        what = f"pid {pgid} ({_what(pgid, proc_root)})"
        if rec.start_ticks is not None and leader[4] != rec.start_ticks:
            return FOREIGN, (
                f"{what} is another process: it started at tick {leader[4]}, the run's launcher at "
                f"tick {rec.start_ticks}"
            )
        if not rec.run_id:
            if rec.start_ticks is None:
                return UNPROVEN, f"{what}: no start time was recorded for it"
            return OURS, ""
        mark = _mark(pgid, rec, proc_root)
        if mark == "":
            return FOREIGN, (
                f"{what} is not the run's: its environment has no {RUN_ID_ENV}={rec.run_id} and it "
                f"is not the run's node wrapper"
            )
        if mark is None:
            return (
                UNPROVEN,
                f"{what}: its environment cannot be read, so nothing shows it is run {rec.run_id}'s",
            )
        if rec.start_ticks is None and mark != "wrapper":
            return UNPROVEN, (
                f"{what} carries run {rec.run_id}'s identity, but no start time was recorded for "
                f"its launcher, so it may be another of the run's processes"
            )
        return OURS, ""
    members = sorted(p for p, v in table.items() if v[1] == pgid and v[3] != "Z")
    if not members:
        return GONE, ""
    if not rec.run_id:
        if rec.start_ticks is None:
            return (
                UNPROVEN,
                f"group {pgid} (pids {members[:5]}): its leader is gone and no start time was recorded",
            )
        return OURS, ""
    marks = [_mark(p, rec, proc_root) for p in members]
    if any(marks):
        return OURS, ""
    if all(m == "" for m in marks):
        return FOREIGN, (
            f"group {pgid} (pids {members[:5]}, {_what(members[0], proc_root)}) is not the run's: "
            f"its leader is gone and none of its processes has {RUN_ID_ENV}={rec.run_id}"
        )
    return UNPROVEN, (
        f"group {pgid} (pids {members[:5]}): its leader is gone and none of its processes shows "
        f"it is run {rec.run_id}'s"
    )


def run_tree(
    pgid: int, leader_start: int | None = None, table: dict[int, ProcEntry] | None = None
) -> dict[int, int]:
    """Live processes of a launcher's tree: pid -> pgid. Empty when nothing is left, or when the
    group's leader pid now belongs to another process (its start time differs from the recorded
    one): a pgid can be reused once all of its processes are gone.

    Zombies are not counted: nothing can stop them, and their parent reaps them.
    """
    table = read_proc() if table is None else table
    if pgid <= 1:
        return {}
    leader = table.get(pgid)
    if leader is not None and leader_start is not None and leader[4] != leader_start:
        # The leader's pid now names a newer process: Linux never reuses a pid while a group of
        # that id has members, so nothing of the run's group is left, and this one is not ours.
        return {}
    live = {pid: v for pid, v in table.items() if v[3] != "Z"}
    children: dict[int, list[int]] = {}
    for pid, v in live.items():
        children.setdefault(v[0], []).append(pid)
    tree = {pid for pid, v in live.items() if v[1] == pgid}
    groups = {pgid}
    while True:
        # descendants of everything found so far, then every member of the groups they lead
        stack = list(tree)
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in tree:
                    tree.add(child)
                    stack.append(child)
        new_groups = {live[p][1] for p in tree} - groups
        # a descendant's own group (torchrun's ranks each lead one) holds only run processes;
        # the caller's group (this tool's) is never taken, whatever happens
        new_groups.discard(os.getpgid(0))
        if not new_groups:
            break
        groups |= new_groups
        tree |= {pid for pid, v in live.items() if v[1] in new_groups}
    return {pid: live[pid][1] for pid in sorted(tree)}


def signal_tree(pgid: int, sig: int, leader_start: int | None = None, whole_tree: bool = True) -> dict:
    """Send `sig` to the launcher's group, and with whole_tree to every group in its tree (the
    ranks' groups first, the launcher's last, so nothing is orphaned before it is signalled)."""
    tree = run_tree(pgid, leader_start)
    if not tree:
        return {"pgid": pgid, "signalled": [], "pids": []}
    own = os.getpgid(0)
    groups = sorted({g for g in tree.values() if g not in (pgid, own) and g > 1}) if whole_tree else []
    sent = []
    for g in [*groups, pgid]:
        try:
            os.killpg(g, sig)
            sent.append(g)
        except (ProcessLookupError, PermissionError):
            pass
    return {"pgid": pgid, "signalled": sent, "pids": sorted(tree)}


def kill_tree(pgid: int, leader_start: int | None = None, rounds: int = 10, pause_s: float = 0.2) -> dict:
    """SIGKILL the whole tree until nothing is left (a process forked between the scan and the
    signal is caught by the next round). Returns what was signalled and what, if anything, is left."""
    signalled: set[int] = set()
    left: dict[int, int] = {}
    for _ in range(rounds):
        out = signal_tree(pgid, signal.SIGKILL, leader_start)
        signalled.update(out["signalled"])
        time.sleep(pause_s)
        left = run_tree(pgid, leader_start)
        if not left:
            break
    return {"pgid": pgid, "signalled": sorted(signalled), "left": sorted(left)}


# ------------------------------------------------------------------------------------ wrapper


def _become_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def _ignore(_signum: int, _frame: FrameType | None) -> None:
    # The stop signal goes to the whole group; the launcher below handles it. The wrapper stays
    # to record how the launcher ended. A Python-level handler (not SIG_IGN) on purpose: handlers
    # are reset by exec, SIG_IGN would be inherited by the launcher and it would never stop.
    return None


def _slurm_step(env: Mapping[str, str]) -> str:
    """JOBID.STEPID of the srun step that started this process, or "" outside one."""
    job, step = env.get("SLURM_JOB_ID", ""), env.get("SLURM_STEP_ID", "")
    return f"{job}.{step}" if job and step else ""


def launch(status_path: Path, node: int, attempt: int, argv: list[str]) -> int:
    """Run argv as the launcher of one node; record identity and exit status; return its status."""
    subreaper = _become_subreaper()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _ignore)
    # The launcher and the trainer of this environment: `accelerate` and `taehv-train` live beside
    # the interpreter that runs this wrapper, which a non-interactive SSH session's PATH lacks.
    bindir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")
    if argv and argv[0] == "python":  # render.LAUNCHER: this interpreter, whatever PATH has
        argv = [sys.executable, *argv[1:]]
    os.environ.setdefault("PYTHONUNBUFFERED", "1")  # log lines in the order they happen
    me = os.getpid()
    status = {
        "node": node,
        "attempt": attempt,
        "pid": me,
        "pgid": os.getpgid(0),
        "hostname": socket.gethostname(),
        "start_ticks": start_ticks(me),
        "boot_id": boot_id(),
        "started": time.time(),
        "argv": argv,
        "exit_code": None,
        "ended": None,
        "subreaper": subreaper,
        # under srun: the step this task belongs to, which a stop signals (`scancel --signal=TERM`)
        "slurm_step": _slurm_step(os.environ),
    }
    _write_json(status_path, status)
    print(
        f"[taehv-console] {time.strftime('%Y-%m-%d %H:%M:%S')} node {node} attempt {attempt} on "
        f"{status['hostname']} (pid {me}): {' '.join(argv)}",
        flush=True,
    )
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    except OSError as err:
        print(f"[taehv-console] cannot start {argv[0]}: {err}", flush=True)
        _write_json(status_path, {**status, "exit_code": 127, "ended": time.time()})
        return 127
    code: int | None = None
    while True:
        try:
            pid, raw = os.waitpid(-1, 0)
        except ChildProcessError:
            break  # nothing left to wait for: the launcher and every orphan it left are gone
        except InterruptedError:  # pragma: no cover - PEP 475 retries, kept for clarity
            continue
        if pid == child.pid and code is None:
            code = os.waitstatus_to_exitcode(raw)
            child.returncode = code  # reaped here; keep Popen from waiting again
            _write_json(status_path, {**status, "exit_code": code, "ended": time.time()})
            print(
                f"[taehv-console] {time.strftime('%Y-%m-%d %H:%M:%S')} node {node}: launcher exited "
                f"with {code}",
                flush=True,
            )
        # any other pid: an orphan re-parented to us (we are its subreaper), reaped so no zombie stays
    if code is None:  # pragma: no cover - waitpid always reports our own child first
        code = 1
    return code if code >= 0 else 128 - code


# --------------------------------------------------------------------------------------- main


def _tree_json(args: argparse.Namespace, start: int | None) -> dict:
    tree = run_tree(args.pgid, start)
    return {
        "pgid": args.pgid,
        "pids": sorted(tree),
        "groups": sorted(set(tree.values())),
        "boot_id": boot_id(),
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m taehv_console.core.run.node")
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("launch", help="run a node's launcher, recording its identity and exit status")
    p.add_argument("--status", required=True, type=Path, help="the status file to write")
    p.add_argument("--node", type=int, help="machine rank of this node")
    p.add_argument(
        "--node-env", metavar="VAR", help="read the machine rank from this variable (SLURM_NODEID)"
    )
    p.add_argument("--attempt", type=int, default=1)
    p.add_argument("command", nargs=argparse.REMAINDER)
    for name, text in (
        ("pids", "list the live processes of a launcher's tree"),
        ("kill", "signal a launcher's group (TERM) or its whole tree (KILL)"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--pgid", type=int, required=True)
        p.add_argument("--start-ticks", type=int, help="the group leader's recorded start time")
        p.add_argument("--boot-id", default="", help="the node's boot id when the leader was recorded")
        p.add_argument("--run-id", default="", help=f"the run it must belong to ({RUN_ID_ENV})")
        p.add_argument("--node", type=int, help="its machine rank (-1: srun)")
        p.add_argument("--attempt", type=int, help="its attempt")
        if name == "kill":
            p.add_argument("--signal", default="TERM", choices=("TERM", "INT", "KILL"))
    return parser


def tree_command(args: argparse.Namespace) -> dict:
    """`pids` and `kill` as a function: the console calls it in-process for this machine (no
    stdout involved, so it is safe from many threads at once)."""
    if args.pgid <= 1:
        return {"error": f"refusing pgid {args.pgid}"}
    table = read_proc()
    rec = Recorded(args.pgid, args.start_ticks, args.boot_id, args.run_id, args.node, args.attempt)
    verdict, why = identify(rec, table)
    if verdict != OURS:
        # nothing proven the run's: listed as nothing, signalled never
        return {
            "pgid": args.pgid,
            "identity": verdict,
            "why": why,
            "pids": [],
            "groups": [],
            "signalled": [],
            "left": [],
            "boot_id": boot_id(),
        }
    # the leader's start time as seen now pins it for the rounds below (a launch recorded before
    # start times were kept is proven by its command line once, here)
    leader = table.get(args.pgid)
    start = args.start_ticks if args.start_ticks is not None else (leader[4] if leader else None)
    if args.action == "pids":
        out = _tree_json(args, start)
    elif args.signal == "KILL":
        out = kill_tree(args.pgid, start)
    else:
        # TERM goes to the launcher's group only: torchrun forwards it to each rank's group and
        # waits for them, which is the trainer's checkpoint-then-exit path
        out = signal_tree(args.pgid, getattr(signal, f"SIG{args.signal}"), start, whole_tree=False)
    return {**out, "identity": OURS, "why": ""}


def main(argv: Iterable[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.action == "launch":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            parser.error("launch needs a command after --")
        node = args.node
        if args.node_env:
            node = int(os.environ[args.node_env])
        if node is None:
            parser.error("give --node or --node-env")
        # {node} in the command and the status path: one srun line serves every node
        command = [c.replace("{node}", str(node)) for c in command]
        status = Path(str(args.status).replace("{node}", str(node)))
        return launch(status, node, args.attempt, command)
    out = tree_command(args)
    print(json.dumps(out))
    return 2 if "error" in out else 0


if __name__ == "__main__":
    sys.exit(main())
