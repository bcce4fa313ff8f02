"""`taehv-console status [RUN]`: a run's phase, nodes (launcher pid/pgid and whether anything of it
is alive, asked of each node), progress, newest checkpoint, newest samples and failure; without
RUN, every run under --runs. Also home of the run options status/stop/resume/attach share.

Imports nothing heavy at module level (`taehv-console --help` imports this file).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from taehv_console.commands.options import add_option, add_ssh_options, ssh_settings
from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.flow.runs import any_alive
from taehv_console.core.run import supervision
from taehv_console.core.run.lock import is_locked, read_holder
from taehv_console.core.run.outcome import settled
from taehv_console.core.run.recovery import recoveries, strike_counts
from taehv_console.core.run.requests import probe_live
from taehv_console.core.run.rundir import RunDir, family_fields, family_text, list_runs, resolve_run
from taehv_console.core.run.state import StateError
from taehv_console.core.watch.checkpoints import verify_checkpoints
from taehv_console.core.watch.monitor import snapshot_once
from taehv_console.core.watch.runwatch import monitor_hosts
from taehv_console.core.watch.samples import newest_samples
from taehv_console.core.watch.view import duration_text, number_text, progress_dict, stall_texts
from taehv_console.exit_codes import CRASHED_MEANING, ExitCode
from trainer import checkpoint as ckpt
from trainer.config import ConfigError

EXIT_CODES = {
    ExitCode.DONE: "shown",
    ExitCode.FAILED: "shown, but --verify found a checkpoint whose files do not match its manifest",
    ExitCode.USAGE: "wrong command line, no such run, or a damaged run: its state.json or run.toml unreadable, of the wrong shape, or state.json gone",
    ExitCode.CRASHED: CRASHED_MEANING,
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


def add_run_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """RUN (or --run RUN before the command's name), --runs, --json and the SSH options."""
    add_option(parser, "run", positional=True, help=f"run directory or id ({what})")
    add_option(parser, "runs")
    add_option(parser, "json", help="print JSON")
    add_ssh_options(parser)


def register(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser, "default: list every run")
    parser.add_argument(
        "--no-check", action="store_true", help="do not ask the nodes which processes are alive"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="with RUN: check every checkpoint's files against its manifest hashes (reads them all)",
    )


def run(args: argparse.Namespace) -> ExitCode:
    # no such run, a damaged run (StateError) 2: cli.main says them (errors.py)
    with SshPool(ssh_settings(args)) as pool:
        if args.run:
            run_dir = resolve_run(args.run, args.runs)
            info = run_info(run_dir, pool, check=not args.no_check)
            if info.get("error"):  # a damaged run: said by path and field, exit 2 as --help says
                if args.json:
                    print(json.dumps(info, indent=2, default=str))
                print(f"taehv-console status: {info['error']}", file=sys.stderr)
                return ExitCode.USAGE
            bad = _verify(run_dir.path, info) if args.verify else 0
            _print_one(info) if not args.json else print(json.dumps(info, indent=2, default=str))
            return ExitCode.FAILED if bad else ExitCode.DONE
        runs = list_runs(args.runs)
        infos = [_listed(r, pool, check=not args.no_check) for r in runs]
    for i in infos:
        if i.get("error"):  # one damaged run never takes the list down
            print(f"taehv-console status: skipping {i['run']}: {i['error']}", file=sys.stderr)
    if args.json:
        print(json.dumps(infos, indent=2, default=str))
    elif not infos:
        print(f"no runs in {args.runs}")
    else:
        _print_list([i for i in infos if not i.get("error")])
    return ExitCode.DONE


def _listed(run: RunDir, pool: SshPool, check: bool) -> dict[str, Any]:
    """One run's line of the list; a run whose files break a reader is a line with its error
    (the readers check the files they know; this keeps the list whole for the ones they do not)."""
    try:
        return run_info(run, pool, check=check, brief=True)
    except Exception as err:  # noqa: BLE001 - the list goes on; the run is named with what broke
        return {"run": run.run_id, "run_dir": str(run.path), "error": f"{type(err).__name__}: {err}"}


def _verify(run_path: Path, info: dict[str, Any]) -> int:
    """Full verification into info["verified"] (and a printed line each); returns how many failed."""
    found = verify_checkpoints(run_path)
    info["verified"] = [
        {"name": st.path.name, "step": st.step, "state": st.state, "problems": list(st.problems)}
        for st in found
    ]
    for st in found:
        text = "complete, hashes match" if st.ok else f"{st.state.upper()}: {'; '.join(st.problems)}"
        print(f"verify {st.path}: {text}", file=sys.stderr)
    return sum(not st.ok for st in found)


# the phase of a run that has trained (events) with no console's state.json or traces of one
OUTSIDE = "started outside the console"


def _newest_checkpoint(run: RunDir) -> dict[str, Any] | None:
    newest = ckpt.scan(run.checkpoints, deep=False).newest
    return (
        {"step": newest.step, "path": str(newest.path), "world_size": newest.world_size} if newest else None
    )


def run_info(run: RunDir, pool: SshPool, check: bool = True, brief: bool = False) -> dict[str, Any]:
    """Everything `status` shows about one run, as plain values (the --json output)."""

    info: dict[str, Any] = {"run": run.run_id, "run_dir": str(run.path)}
    try:
        cfg = run.load_config()
        info["preset"] = cfg.run.preset
        info.update(family_fields(cfg.model.family))
        info["topology"] = f"{cfg.topology.nodes} x {cfg.topology.gpus_per_node} {cfg.topology.device}"
    except ConfigError as err:
        info["error"] = str(err)
        return info
    if not run.has_state():
        lost = run.lost_state()  # launched, and its state.json is gone: not "rendered"
        if lost:
            info["error"] = lost
        elif any(run.path.glob("events/rank-*.jsonl")):
            # trained, but not by a console (its rendered sbatch.sh submitted by hand, taehv-train):
            # nothing here controls or heals it; its progress and checkpoints are read from its files
            info["phase"] = OUTSIDE
            info["progress"] = progress_dict(snapshot_once(run.path, pool=pool))
            info["checkpoint"] = _newest_checkpoint(run)
        else:
            info["phase"] = "rendered"  # files only (render), never launched
        return info
    refused: dict[int, str] = {}
    try:
        state, procs = probe_live(run, pool, refused) if check else (run.read_state(), {})
    except StateError as err:
        info["error"] = str(err)
        return info
    a = state.attempt
    info.update(
        phase=state.phase.value,
        settled=settled(state),  # ended for good: no restart decided or due
        backend=state.backend.value,
        hosts=list(state.hosts),
        attempts=len(state.attempts),
        recoveries=[asdict(r) for r in recoveries(state.attempts)],
        strikes={str(k): v for k, v in strike_counts(state.attempts).items()},
        exclusions=[asdict(e) for e in state.exclusions],
        spares=list(state.spares),
    )
    if is_locked(run.lock_path):
        info["controlled_by"] = read_holder(run.lock_path)
    if supervision.supervised(state.backend):
        # who heals the run while no window is open: None when nobody does (a console that opens
        # the run starts a supervisor again)
        sup = supervision.running_supervisor(run)
        info["supervisor"] = {**sup, "log": str(supervision.log_path(run))} if sup is not None else None
    live = a is not None and a.ended is None
    # The run's one view, read once: the same phase, progress, ETA, per-rank health, stalls and
    # forensics the following console shows. A live run's nodes are sampled once (process states).
    view = snapshot_once(
        run.path,
        hosts=monitor_hosts(state.backend, state.hosts),
        pool=pool,
        agents=live and check and not brief,
    )
    info["progress"] = progress_dict(view)
    info["stalled"] = [
        {
            "rank": s.rank,
            "node": s.node,
            "pid": s.pid,
            "detail": s.detail,
            "waiting": list(s.waiting),
            "text": s.text,
        }
        for s in stall_texts(view)
    ]
    if live and check:
        alive = {n: (str(p) if isinstance(p, Exception) else list(p)) for n, p in procs.items()}
        info["alive"] = alive
        info["live"] = any_alive(procs)
        # recorded pids the nodes would not call the run's: never "alive", always said
        info["not_the_runs"] = {str(n): why for n, why in sorted(refused.items())}
    info["attention"] = list(state.attention)
    if brief:
        return info
    plain = view.to_dict()
    info["ranks"] = plain["ranks"]
    info["collective"] = plain["collective"]
    info["forensics"] = plain["forensics"]
    info["checkpoint"] = _newest_checkpoint(run)
    info["nodes"] = [asdict(n) for n in a.nodes] if a else []
    info["attempt"] = (
        {
            "number": a.number,
            "resume": a.resume,
            "weights_only": a.weights_only,
            "outcome": a.outcome,
            "slurm_job": a.slurm_job,
        }
        if a
        else None
    )
    info["failure"] = asdict(state.failure) if state.failure else None
    info["stop"] = asdict(state.stop) if state.stop else None
    info["final_weights"] = str(run.final_weights) if run.final_weights.is_file() else None
    samples = newest_samples(run.path)
    info["samples"] = samples.to_dict() if samples is not None else None
    return info


def _print_list(infos: list[dict[str, Any]]) -> None:
    table = Table(box=None, pad_edge=False, header_style="bold")
    # a run's id is never cut (it is what the other commands take): the other columns wrap first
    table.add_column("run", no_wrap=True, min_width=max((len(i["run"]) for i in infos), default=3))
    for col in ("family", "phase", "step", "nodes", "backend"):
        table.add_column(col)
    for i in infos:
        p = i.get("progress") or {}
        phase = i.get("phase", "?")
        if i.get("stalled"):
            phase += " (rank " + ", ".join(str(s["rank"]) for s in i["stalled"]) + " stalled)"
        if i.get("live") is False and phase in ("running", "stopping", "launching"):
            phase += " (nothing alive)"
        table.add_row(
            i["run"],
            i.get("family", "-"),
            phase,
            f"{p.get('step', '-')}/{p.get('max_steps', '-')}",
            i.get("topology", ""),
            i.get("backend", "-"),
        )
    Console().print(table)


def _print_one(i: dict[str, Any]) -> None:
    c = Console(highlight=False, soft_wrap=True)  # paths stay whole on narrow panes
    c.print(f"[bold]{i['run']}[/] ({i['run_dir']})")
    if i.get("error"):
        c.print(f"[red]{i['error']}[/]")
        return
    c.print(
        f"  phase {i.get('phase')}, preset {i.get('preset')}, {i.get('topology')}, backend {i.get('backend', '-')}"
    )
    if i.get("family"):
        c.print(f"  family {family_text(i)}", markup=False)
    sup = i.get("supervisor")
    if sup:
        c.print(
            f"  supervisor pid {sup.get('pid')} on {sup.get('host')} (log {sup.get('log')})", markup=False
        )
    elif "supervisor" in i and not i.get("settled", True):
        c.print(
            "  [yellow]no supervisor runs for it[/]: a failure now waits for someone; "
            f"`taehv-console attach {i['run_dir']}` or `taehv-console supervise {i['run_dir']}` starts one"
        )
    h = i.get("controlled_by")
    if h and h.get("purpose") != supervision.PURPOSE:
        c.print(f"  controlled by console pid {h.get('pid')} on {h.get('host')} ({h.get('purpose', '')})")
    p = i.get("progress")
    if p:
        step = f"{p.get('step')}/{p.get('max_steps')}" if p.get("max_steps") else str(p.get("step", "-"))
        c.print(
            f"  {p.get('phase')} step {step} loss {number_text(p.get('loss'), '.4g')} psnr "
            f"{number_text(p.get('psnr'), '.2f')} clips/s {number_text(p.get('samples_per_s'), '.3g')} "
            f"eta {duration_text(p.get('eta_s'))}"
        )
        for what in p.get("damaged") or []:  # a damaged event or heartbeat line: named, read past
            c.print(f"  [yellow]damaged[/]: {escape(str(what))}")
    for st in i.get("stalled", []):
        c.print(f"  [red]STALL[/]: {st['text']}", markup=True)
        f = next((f for f in reversed(i.get("forensics") or []) if f.get("rank") == st["rank"]), None)
        for frame in (f or {}).get("frames", [])[:6]:
            c.print(f"    {frame}", markup=False)
    for n in i.get("nodes", []):
        alive = (i.get("alive") or {}).get(n["index"])
        refused = (i.get("not_the_runs") or {}).get(str(n["index"]))
        if refused:
            live = f", not the run's: {refused}"
        elif isinstance(alive, str):
            live = f", unknown: {alive}"
        else:
            live = "" if alive is None else (f", alive: {alive}" if alive else ", nothing alive")
        c.print(
            f"  node {n['index']} {n['host']}: pid {n['pid']} pgid {n['pgid']}{live}  log {n['log']}",
            markup=False,
        )
    for line in i.get("attention", []):
        c.print(f"  [yellow]needs attention[/]: {escape(line)}")
    if i.get("checkpoint"):
        c.print(f"  newest checkpoint: step {i['checkpoint']['step']} ({i['checkpoint']['path']})")
    if i.get("failure"):
        f = i["failure"]
        c.print(
            f"  [red]failed[/]: node {f.get('node')} ({f.get('host')}), rank {f.get('rank')}: {f.get('reason')}"
        )
        for line in f.get("log_lines", []):
            c.print(f"    | {line}")
    for r in i.get("recoveries", []):
        where = f" on node {r['node']}" if r.get("node") is not None else ""
        cost = (
            f": {duration_text(r['lost_s'])} lost, {r.get('redone_steps')} step(s) redone"
            if r.get("lost_s") is not None
            else ""
        )
        c.print(f"  attempt {r['attempt']}: {r['cause']}{where} -> {r['action']}{cost}", markup=False)
    for e in i.get("exclusions", []):
        instead = f"spare {e['replaced_by']} in its place" if e.get("replaced_by") else "not replaced"
        c.print(
            f"  left out: node {e['node']} ({e['host']}) after attempt {e['attempt']}, {instead}; "
            f"{e['nodes_before']} -> {e['nodes_after']} node(s)",
            markup=False,
        )
    if i.get("stop"):
        s = i["stop"]
        c.print(
            f"  stop ({s.get('reason')} by {s.get('by')}): checkpoint step {s.get('checkpoint_step')}, "
            f"nothing left: {s.get('verified')}"
        )
    if i.get("final_weights"):
        c.print(f"  weights: {i['final_weights']}")
    if i.get("samples"):
        s = i["samples"]
        c.print(f"  newest samples: step {s['step']} ({s['dir']})", markup=False)
        for clip in s["clips"]:
            psnr = number_text(clip.get("psnr"), ".2f")
            files = "  ".join(p for p in (clip["png"], clip.get("video")) if p)
            c.print(f"    clip {clip['index']}: PSNR {psnr} dB  {files}", markup=False)
