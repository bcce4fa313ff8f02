"""`taehv-console --no-tui`: the console's flow without a screen, on the same core as the TUI.

detect -> preflight (errors end it: exit PREFLIGHT_FAILED, findings printed) -> preset (auto, or
--preset) -> launch, or attach when this run is already live -> progress until the run ends.
SIGTERM/SIGINT stop the whole run gracefully (checkpoint), then exit STOPPED; a second signal cuts
the grace period short. On a machine without GPUs and without --data the cpu-smoke preset trains
on generated clips, so the README's main command works on a laptop.

Progress: a rich progress bar when stdout is a terminal, timestamped lines otherwise (container
logs), and with --json one JSON object per line (trainer events as they are, plus the console's
own `phase`, `note` and a final `result`).

Nothing heavy is imported at module level: `taehv-console --help` imports this file.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO


class ExitCode(enum.IntEnum):
    """How `taehv-console --no-tui` (and attach/resume) ended. An API: scripts match on it."""

    DONE = 0  # every rank reached max_steps; final weights written
    TRAINING_FAILED = 1  # a rank or launcher failed; state.json names the node and rank
    USAGE = 2  # the command line, a config or the environment is wrong (argparse uses 2 too)
    PREFLIGHT_FAILED = 3  # preflight found errors; nothing was started
    STOPPED = 4  # stopped on request (signal, `taehv-console stop`); resumable from its checkpoint
    BUSY = 5  # another console controls the run, or it is already running (attach instead)
    INTERRUPTED = 130  # Ctrl-C before a run was being followed (shell convention); nothing was stopped


def exit_code_for(phase: Any) -> ExitCode:
    value = getattr(phase, "value", phase)
    return {"done": ExitCode.DONE, "stopped": ExitCode.STOPPED, "failed": ExitCode.TRAINING_FAILED}.get(
        value, ExitCode.TRAINING_FAILED)


EXIT_CODES_HELP = "exit codes: " + ", ".join(f"{c.value} {c.name.lower()}" for c in ExitCode)


# ----------------------------------------------------------------------------------- arguments

def add_launch_options(parser: argparse.ArgumentParser) -> None:
    """Options of the headless flow (also shown in `taehv-console --help`)."""
    g = parser.add_argument_group("headless run (--no-tui)")
    g.add_argument("--hosts", metavar="FILE", help="DeepSpeed hostfile ('host slots=N' per line): launch over SSH")
    g.add_argument("--preset", default="auto", metavar="NAME|PATH|auto",
                   help="preset, or a run's run.toml (a platform pod's run); default auto")
    g.add_argument("--data", metavar="DIR", help="data source (sets data.source); without it and without GPUs "
                                                 "the cpu-smoke preset trains on generated clips")
    g.add_argument("--runs", metavar="DIR", default="runs", help="runs directory on shared storage (default ./runs)")
    g.add_argument("--run", metavar="RUN", help="an existing run directory or id: attach if live, else launch it")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. optim.max_steps=100; repeatable")
    g.add_argument("--env", dest="launch_env", action="append", default=[], metavar="KEY=VALUE",
                   help="extra environment for every node's launcher; repeatable")
    g.add_argument("--master-port", type=int, metavar="PORT", help="rendezvous port on node 0 (default: a free one)")
    g.add_argument("--backend", choices=("auto", "local", "ssh", "platform", "slurm", "sbatch"), default="auto",
                   help="how nodes are started (auto: from the detected topology)")
    g.add_argument("--grace", type=float, metavar="S", help="seconds a stop waits for the checkpoint (default 120)")
    g.add_argument("--json", action="store_true", help="stream JSON lines instead of a progress display")


def parse_env(items: list[str]) -> dict[str, str]:
    env = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.replace("_", "a").isalnum() or key[0].isdigit():
            raise ValueError(f"--env {item!r}: expected KEY=VALUE with a plain variable name")
        env[key] = value
    return env


# --------------------------------------------------------------------------------------- views
# Every view renders the RunView of the run's one watch pipeline (core/watch): phase, progress,
# ETA, stalls and their forensics read the same here as in the TUI and `status`. The controller's
# snapshot adds only what the console itself did (notes) and the trainer's events as they are.


def _num(value: Any, fmt: str) -> str:
    from taehv_console.core.watch.view import number_text

    return number_text(value, fmt)


class _Watched:
    """What a view has already said about the RunView, so each stall, recovery and forensics
    report is told once."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.stalled: dict[int, str] = {}  # rank -> the detail it was named with
        self.reports: set[str] = set()

    def changes(self, view: Any) -> tuple[list[Any], list[int], list[Any]]:
        """(newly stalled StallTexts, ranks no longer stalled, new forensics summaries)."""
        from taehv_console.core.watch.view import stall_texts

        now = {s.rank: s for s in stall_texts(view)}
        new = [s for r, s in now.items() if r not in self.stalled]
        cleared = [r for r in self.stalled if r not in now]
        self.stalled = {r: s.detail for r, s in now.items()}
        reports = [f for f in view.forensics if f.report not in self.reports]
        self.reports.update(f.report for f in reports)
        return new, cleared, reports


def _frames_lines(summary: Any, top: int = 6) -> list[str]:
    head = f"forensics for rank {summary.rank} (pid {summary.pid}, node {summary.node}):"
    lines = [head] + [f"  {f}" for f in summary.frames[:top]]
    if not summary.frames:
        lines.append("  no stack: " + ("; ".join(summary.notes) or "py-spy gave none"))
    else:
        lines += [f"  note: {n}" for n in summary.notes]
    if summary.flight_recorder:
        lines.append(f"  flight recorder: {summary.flight_recorder}")
    if summary.ras:
        lines.append(f"  NCCL RAS: {summary.ras}")
    if summary.report:
        lines.append(f"  report: {summary.report}")
    return lines


class PlainView:
    """Timestamped lines, progress at most every `every_s` seconds, stalls and forensics at once:
    what a container's log collector wants."""

    def __init__(self, out: TextIO, every_s: float = 5.0):
        self.out = out
        self.every_s = every_s
        self._last = 0.0
        self._step_shown: int | None = -1
        self._seen = _Watched()

    def _line(self, text: str) -> None:
        self.out.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
        self.out.flush()

    def note(self, text: str) -> None:
        self._line(text)

    def update(self, snap: Any, view: Any = None) -> None:
        for note in snap.notes:
            self._line(note)
        for e in snap.events:
            kind = e.get("kind")
            if e.get("rank") != 0 and kind != "error":
                continue
            if kind == "checkpoint" and e.get("status") == "complete":
                self._line(f"checkpoint step {e.get('step')} ({_num(e.get('seconds'), '.1f')} s)")
            elif kind == "val":
                self._line(f"validation step {e.get('step')}: PSNR {_num(e.get('psnr'), '.2f')} dB")
            elif kind == "error":
                self._line(f"rank {e.get('rank')} error: {str(e.get('message', ''))[:300]}")
        if view is None:
            return
        self.health(view)
        run = view.run
        now = time.time()
        last = run.step is not None and run.max_steps is not None and run.step >= run.max_steps
        if run.step != self._step_shown and (now - self._last >= self.every_s or last):
            self._last, self._step_shown = now, run.step
            self._line(self.progress_text(view))

    def health(self, view: Any) -> None:
        if view.run.phase != self._seen.phase:
            self._seen.phase = view.run.phase
            self._line(f"{view.run.run_id}: {view.run.phase}")
        new, cleared, reports = self._seen.changes(view)
        for s in new:
            self._line(f"STALL: {s.text}")
        for r in cleared:
            self._line(f"rank {r} is no longer stalled")
        for f in reports:
            for line in _frames_lines(f):
                self._line(line)

    @staticmethod
    def progress_text(view: Any) -> str:
        from taehv_console.core.watch.view import headline

        return headline(view).text

    def close(self) -> None:
        return None


class RichView(PlainView):
    """A progress bar (step, loss, PSNR, clips/s, ETA) with notes, stalls and forensics above it."""

    def __init__(self, out: TextIO):
        super().__init__(out)
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        self.console = Console(file=out)
        self.bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[stats]}"), console=self.console, transient=False)
        self.task = self.bar.add_task("starting", total=None, stats="")
        self.bar.start()

    def _line(self, text: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {text}", highlight=False, markup=False)

    def update(self, snap: Any, view: Any = None) -> None:
        for note in snap.notes:
            self._line(note)
        for e in snap.events:
            if e.get("kind") == "checkpoint" and e.get("rank") == 0 and e.get("status") == "complete":
                self._line(f"checkpoint step {e.get('step')}")
            elif e.get("kind") == "error":
                self._line(f"rank {e.get('rank')} error: {str(e.get('message', ''))[:300]}")
        if view is None:
            return
        from taehv_console.core.watch.view import headline

        self.health(view)
        h = headline(view)
        stats = f"loss {h.loss}  psnr {h.psnr} dB  {h.clips_per_s} clips/s  eta {h.eta}"
        self.bar.update(self.task, completed=view.run.step or 0, total=view.run.max_steps, description=h.phase,
                        stats=stats)

    def close(self) -> None:
        self.bar.stop()


class JsonView:
    """One JSON object per line: trainer events verbatim (`source: trainer`) and the console's
    own (`source: console`: phase, note, stall, recovered, forensics, health, result)."""

    def __init__(self, out: TextIO):
        self.out = out
        self._seen = _Watched()
        self._health: Any = None

    def emit(self, obj: Mapping[str, Any]) -> None:
        self.out.write(json.dumps(obj, default=str) + "\n")
        self.out.flush()

    def note(self, text: str) -> None:
        self.emit({"source": "console", "kind": "note", "time": time.time(), "message": text})

    def update(self, snap: Any, view: Any = None) -> None:
        for note in snap.notes:
            self.note(note)
        for e in snap.events:
            self.emit({"source": "trainer", **e})
        if view is None:
            return
        from dataclasses import asdict

        from taehv_console.core.watch.view import progress_dict

        t = time.time()
        base = {"source": "console", "time": t, "run": view.run.run_id}
        if view.run.phase != self._seen.phase:
            self._seen.phase = view.run.phase
            self.emit({**base, "kind": "phase", "phase": view.run.phase, "attempt": snap.attempt,
                       "progress": progress_dict(view)})
        new, cleared, reports = self._seen.changes(view)
        for s in new:
            self.emit({**base, "kind": "stall", **asdict(s), "message": s.text})
        for r in cleared:
            self.emit({**base, "kind": "recovered", "rank": r})
        for f in reports:
            self.emit({**base, "kind": "forensics", **asdict(f)})
        health = tuple((r.rank, r.state.value, r.blocked_by) for r in view.ranks)
        if health != self._health:
            self._health = health
            self.emit({**base, "kind": "health", "ranks": [
                {"rank": r.rank, "node": r.node, "state": r.state.value, "step": r.step, "blocked_by": r.blocked_by,
                 "heartbeat_age_s": r.heartbeat_age_s, "score": r.score, "waiting_s": r.waiting_s,
                 "detail": r.detail} for r in view.ranks]})

    def result(self, obj: Mapping[str, Any]) -> None:
        self.emit({"source": "console", "kind": "result", "time": time.time(), **obj})

    def close(self) -> None:
        return None


def make_view(json_mode: bool, out: TextIO | None = None) -> Any:
    out = out or sys.stdout
    if json_mode:
        return JsonView(out)
    if out.isatty():
        return RichView(out)
    return PlainView(out)


# ---------------------------------------------------------------------------------- following

class _Signals:
    """SIGTERM/SIGINT -> a graceful stop of the run; a second one cuts the grace short."""

    def __init__(self, view: Any):
        self.view = view
        self.count = 0
        self.ctrl = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.count += 1
        if self.count == 1:
            self.view.note(f"{signal.Signals(signum).name}: stopping the whole run (checkpoint first); "
                           "send it again to skip the wait")
        elif self.ctrl is not None:
            self.ctrl.hurry = True

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def follow(ctrl: Any, view: Any, grace_s: float | None = None) -> ExitCode:
    """Follow a launched or attached run to its end, rendering the run's RunView (its one watch
    pipeline, with stall forensics) into `view`; SIGTERM/SIGINT stop it gracefully. Returns the
    ExitCode of its outcome and prints a summary."""
    from taehv_console.core.watch.runwatch import RunWatch

    if grace_s is not None:
        ctrl.grace_s = grace_s
    sigs = _Signals(view)
    sigs.ctrl = ctrl
    sigs.install()
    watch = RunWatch.for_controller(ctrl).start()
    try:
        outcome = ctrl.follow(lambda snap: view.update(snap, watch.view()), should_stop=lambda: sigs.count > 0)
        view.update(ctrl.snapshot(), watch.final_view())
    finally:
        watch.stop()
        sigs.restore()
    view.close()
    return report_outcome(ctrl, outcome, view, watch.final_view())


def report_ended(ctrl: Any, view: Any) -> ExitCode:
    """A run that is not running (any more): its RunView read once, then how it ended."""
    from taehv_console.core.watch.monitor import snapshot_once

    run_view = snapshot_once(ctrl.run.path)
    view.update(ctrl.snapshot(), run_view)
    return report_outcome(ctrl, ctrl.outcome(), view, run_view)


def report_outcome(ctrl: Any, outcome: Any, view: Any, run_view: Any = None) -> ExitCode:
    code = exit_code_for(outcome.phase)
    summary = outcome_dict(ctrl, outcome, code, run_view)
    if isinstance(view, JsonView):
        view.result(summary)
        return code
    p = summary["progress"]
    view.note(f"{ctrl.run.run_id}: {outcome.phase.value} at step {p.get('step')}"
              f"/{p.get('max_steps')} (exit {code.value} {code.name.lower()})")
    if outcome.failure is not None:
        view.note(f"failure: {outcome.failure.summary()}")
        for line in outcome.failure.log_lines:
            view.note(f"  | {line}")
    if outcome.stop is not None and outcome.phase.value == "stopped":
        s = outcome.stop
        view.note(f"stop: checkpoint at step {s.checkpoint_step}" if s.checkpoint_step is not None
                  else "stop: no checkpoint was written by this stop")
        view.note("resume with: taehv-console resume " + str(ctrl.run.path))
    if outcome.final_weights:
        view.note(f"weights: {outcome.final_weights}")
    return code


def outcome_dict(ctrl: Any, outcome: Any, code: ExitCode, run_view: Any = None) -> dict[str, Any]:
    from dataclasses import asdict

    from taehv_console.core.watch.view import progress_dict

    progress = {**(progress_dict(run_view) if run_view is not None else {}), **dict(outcome.progress)}
    return {"run": ctrl.run.run_id, "run_dir": str(ctrl.run.path), "phase": outcome.phase.value,
            "exit_code": int(code), "exit_name": code.name.lower(), "progress": progress,
            "failure": asdict(outcome.failure) if outcome.failure else None,
            "stop": asdict(outcome.stop) if outcome.stop else None, "final_weights": outcome.final_weights}


# ------------------------------------------------------------------------------------- the flow

def _fail(view: Any, code: ExitCode, message: str) -> ExitCode:
    if isinstance(view, JsonView):
        view.result({"phase": None, "exit_code": int(code), "exit_name": code.name.lower(), "error": message})
    else:
        print(f"taehv-console: {message}", file=sys.stderr)
    return code


def run(args: argparse.Namespace) -> int:
    """The whole headless flow; returns an ExitCode."""
    view = make_view(args.json)
    try:
        return int(_run(args, view))
    except KeyboardInterrupt:
        # before `follow` took over the signals: detection, preflight or the launch itself
        return _fail(view, ExitCode.INTERRUPTED, "interrupted; a run already launched keeps running "
                                                 "(see `taehv-console status`, stop it with `taehv-console stop`)")
    finally:
        view.close()


def _run(args: argparse.Namespace, view: Any) -> ExitCode:
    from taehv_console.commands.detect import detect, ssh_settings
    from taehv_console.core.cluster.hosts import InvalidHostError
    from taehv_console.core.cluster.platform import TopologyError
    from taehv_console.core.cluster.ssh import SshPool
    from taehv_console.core.run.lock import RunBusyError
    from taehv_console.core.run.rundir import RunNotFoundError, resolve_run
    from trainer.config import ConfigError

    try:
        env = parse_env(args.launch_env)
    except ValueError as err:
        return _fail(view, ExitCode.USAGE, str(err))
    run_ref = args.run
    if not run_ref and args.preset.endswith("run.toml") and os.path.isfile(args.preset):
        run_ref = os.path.dirname(os.path.abspath(args.preset))  # a platform pod: the rendered run
    settings = ssh_settings(args)
    with SshPool(settings) as pool:
        existing = None
        if run_ref:
            try:
                existing = resolve_run(run_ref, args.runs)
            except RunNotFoundError as err:
                return _fail(view, ExitCode.USAGE, str(err))
        try:
            view.note("detecting the cluster")
            topology, probes = detect(args)
        except (TopologyError, InvalidHostError) as err:
            return _fail(view, ExitCode.USAGE, str(err))
        backend = args.backend if args.backend != "auto" else _backend_for(topology.source)
        if backend is None:
            return _fail(view, ExitCode.USAGE, "taehv-console runs once per node, not once per process: start it "
                                               "outside torchrun/accelerate (the per-process variables are set)")
        try:
            # 1. a run that is already live: attach to it, never launch it twice
            if backend != "platform":
                candidate = existing if existing is not None and existing.has_state() else \
                    (_live_run_on(args.runs, topology, pool) if existing is None else None)
                if candidate is not None:
                    code = _attach_if_live(candidate, pool, view, args, named=existing is not None)
                    if code is not None:
                        return code
            # 2. preflight, config
            cfg, chosen = _config(args, topology, probes, existing, view)
            if backend == "sbatch":
                # SLURM picks the nodes after submission: nothing here to check them against
                view.note("sbatch: preflight skipped (run `taehv-console preflight` inside an allocation)")
                return _launch_new(args, topology, cfg, backend, env, pool, view, existing)
            report = _preflight(args, topology, probes, cfg, pool, view)
            if not report.ok:
                _print_findings(view, report, chosen)
                return ExitCode.PREFLIGHT_FAILED
            _print_findings(view, report, chosen)
            # 3. launch
            if backend == "platform":
                return _platform(args, topology, cfg, existing, env, pool, view)
            return _launch_new(args, topology, cfg, backend, env, pool, view, existing)
        except RunBusyError as err:
            return _fail(view, ExitCode.BUSY, str(err))
        except ConfigError as err:
            return _fail(view, ExitCode.USAGE, str(err))
        except _Refused as err:
            return _fail(view, err.code, str(err))


class _Refused(Exception):
    def __init__(self, code: ExitCode, message: str):
        super().__init__(message)
        self.code = code


def _backend_for(source: Any) -> str | None:
    from taehv_console.core.models import TopologySource as S

    return {S.HOSTFILE: "ssh", S.LOCAL: "local", S.SLURM: "slurm", S.PAI_DLC: "platform", S.KUBEFLOW: "platform",
            S.NODE_ENV: "platform", S.K8S_INDEXED_JOB: "platform"}.get(source)


def _live_run_on(runs_dir: str, topology: Any, pool: Any) -> Any:
    """The newest run under runs_dir that is still running on these same nodes, if any: the run a
    second `--no-tui` should attach to instead of starting another on busy machines."""
    from taehv_console.core.run.control import probe_live
    from taehv_console.core.run.rundir import list_runs
    from taehv_console.core.run.state import StateError

    hosts = tuple(topology.hosts) if topology.uses_ssh else ("localhost",)
    for run in list_runs(runs_dir)[:20]:
        if not run.has_state():
            continue
        try:
            state, procs = probe_live(run, pool)
        except (StateError, OSError):
            continue
        if state.phase.ended or tuple(state.hosts) != hosts:
            continue
        if any(isinstance(p, Exception) or p for p in procs.values()):
            return run
    return None


def _attach_if_live(run: Any, pool: Any, view: Any, args: argparse.Namespace, named: bool) -> ExitCode | None:
    """Attach when the run's processes are alive (RunBusyError when another console has it);
    None when the run should be launched (not live, never started)."""
    from taehv_console.core.run.control import RunController

    ctrl = RunController.open(run, pool, purpose="attach (--no-tui)")
    try:
        if ctrl.attempt is None:
            return None  # created, never started: launch it
        if ctrl.reconcile() != "live":
            if named:  # the named run has ended: show how, do not start it again behind the user's back
                view.note(f"{run.run_id} is not running; to continue it: taehv-console resume {run.path}")
                return report_ended(ctrl, view)
            return None
        view.note(f"{run.run_id} is running: attaching to it instead of launching")
        return follow(ctrl, view, args.grace)
    finally:
        ctrl.close()


def _config(args: argparse.Namespace, topology: Any, probes: Any, existing: Any, view: Any) -> tuple[Any, str]:
    """The run's config: an existing run's run.toml, else --preset/auto with --set and --data;
    a CPU config without data gets generated clips (the embedded default)."""
    from taehv_console.commands.preflight import choose_config

    if existing is not None:
        cfg = existing.load_config()
        return cfg, f"run {existing.run_id} ({existing.run_toml})"
    cfg, chosen = choose_config(args, topology, probes)
    if not cfg.data.source and not args.data and cfg.topology.device == "cpu":
        clips = _generated_clips(args.runs, cfg, view)
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"source": clips})})
        chosen += f"; no GPU and no --data: training on generated clips in {clips}"
    return cfg, chosen


def _generated_clips(runs_dir: str, cfg: Any, view: Any) -> str:
    """Real video files for the smoke preset, made once per size under the runs directory (shared
    storage, so every node reads the same clips) and reused by later runs."""
    from pathlib import Path

    d = cfg.data
    folder = Path(runs_dir).absolute() / "generated-clips" / f"{d.frames}x{d.height}x{d.width}"
    done = folder / ".complete"
    if not done.exists():
        from trainer.synthetic import make_synthetic

        view.note(f"generating demo clips in {folder}")
        # enough frames for the largest frame step, and enough clips for a validation split
        make_synthetic(folder, clips=12, frames=d.frames * d.max_delta + 4, height=d.height, width=d.width, seed=0)
        done.write_text("")
    return str(folder)


def _preflight(args: argparse.Namespace, topology: Any, probes: Any, cfg: Any, pool: Any, view: Any) -> Any:
    from taehv_console.core.cluster.preflight import PreflightOptions, run_preflight

    if args.master_port:
        port = args.master_port
    elif topology.source.value in ("local", "hostfile"):
        port = _free_port(topology, pool)
    else:
        port = topology.master_port  # the platform's MASTER_PORT: every pod uses the same one
    args.master_port = port
    options = PreflightOptions(runs_dir=args.runs, data_source=cfg.data.source, master_port=port)
    return run_preflight(topology, cfg, pool, options, progress=view.note, probes=probes)


def _free_port(topology: Any, pool: Any, first: int | None = None) -> int:
    """The topology's port (29500 unless MASTER_PORT says otherwise) if node 0 has it free, else
    the next free one: a laptop or a shared head node often has 29500 taken."""
    from taehv_console.core.cluster.preflight import NODECHECK

    port = first or topology.master_port
    host = topology.hosts[0] if topology.uses_ssh else "localhost"
    runner = pool.runner(host)
    for candidate in range(port, port + 50):
        try:
            res = runner.run([runner.python, "-m", NODECHECK, "port-free", "--port", str(candidate)], timeout=30)
            answer = json.loads(res.stdout.strip().splitlines()[-1])
        except Exception:  # noqa: BLE001 - preflight reports an unreachable node properly
            return port
        if answer.get("free"):
            return candidate
    return port


def _print_findings(view: Any, report: Any, chosen: str) -> None:
    if isinstance(view, JsonView):
        view.emit({"source": "console", "kind": "preflight", "time": time.time(), "config": chosen,
                    **report.to_dict()})
        return
    view.note(f"config: {chosen}")
    for f in report.findings:
        if f.severity.value == "info":
            continue
        view.note(f"{f.severity.value}: {f.message}" + (f" (fix: {f.fix})" if f.fix else ""))
    if not report.ok:
        view.note(f"preflight: {len(report.errors)} error(s); nothing was started")


def _launch_new(args: argparse.Namespace, topology: Any, cfg: Any, backend: str, env: dict[str, str], pool: Any,
                view: Any, existing: Any) -> ExitCode:
    from taehv_console.core.cluster.ssh import resolve_target
    from taehv_console.core.run.control import (
        LaunchError,
        LaunchSpec,
        RunController,
        RunLiveError,
        create_run,
    )

    if backend == "ssh":
        hosts = tuple(topology.hosts)
        first = hosts[0]
        master = first if first in ("localhost", "127.0.0.1") else resolve_target(first, pool.settings).hostname
    elif backend == "local":
        hosts, master = ("localhost",), "127.0.0.1"
    else:  # slurm / sbatch
        hosts, master = tuple(topology.hosts), topology.master_addr
    spec = LaunchSpec(backend=backend, hosts=hosts, master_addr=master, master_port=args.master_port or 29500,
                      env=env)
    run = create_run(args.runs, cfg, spec, run=existing)
    view.note(f"run {run.run_id} in {run.path}")
    ctrl = RunController.open(run, pool, purpose="launch (--no-tui)")
    try:
        if args.grace:
            ctrl.grace_s = args.grace  # before the launch: torchrun's own shutdown wait follows it
        try:
            ctrl.launch()
        except RunLiveError as err:
            raise _Refused(ExitCode.BUSY, str(err)) from None
        except LaunchError as err:
            view.note(f"launch failed: {err}")
            return report_outcome(ctrl, ctrl.outcome(), view)
        for line in ctrl.backend.describe(ctrl.attempt):
            view.note(line)
        return follow(ctrl, view, args.grace)
    finally:
        ctrl.close()


def _platform(args: argparse.Namespace, topology: Any, cfg: Any, existing: Any, env: dict[str, str], pool: Any,
              view: Any) -> ExitCode:
    """A pod/container: launch this node (machine rank = the platform's node index); node 0 also
    records the run's state and reports on every node, the others follow their own node."""
    import dataclasses

    from taehv_console.core.plan.render import RenderOptions, accelerate_config_name, render_accelerate_yaml
    from taehv_console.core.run.control import LaunchError, RunController
    from taehv_console.core.run.rundir import create_run_dir
    from taehv_console.core.run.state import Phase, RunState

    rank = topology.this_node_rank or 0
    nodes = topology.node_count
    if nodes > 1 and existing is None:
        raise _Refused(ExitCode.USAGE, f"{topology.source.value}: node {rank} of {nodes}: every pod must name the "
                                       "same run: --run DIR on shared storage, or --preset DIR/run.toml as the "
                                       "rendered Kubernetes Job does")
    if cfg.topology.nodes != nodes:
        raise _Refused(ExitCode.USAGE, f"the run's config has {cfg.topology.nodes} node(s) but the platform started "
                                       f"{nodes}: render the run for {nodes} node(s)")
    run = existing or create_run_dir(args.runs, cfg.run.preset)
    run.logs.mkdir(parents=True, exist_ok=True)
    if existing is None:
        from trainer.config import config_to_toml

        run.run_toml.write_text(config_to_toml(cfg))
    # this node's accelerate config, with the master the platform gave (a temp name of our own:
    # every pod writes into the same shared directory)
    opts = RenderOptions(run_dir=str(run.path), main_process_ip=topology.master_addr,
                         main_process_port=args.master_port or topology.master_port)
    target = run.path / accelerate_config_name(rank)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_text(render_accelerate_yaml(cfg, rank, opts))
    os.replace(tmp, target)
    state = RunState(run_id=run.run_id, phase=Phase.CREATED, backend="platform", hosts=(),
                     master_addr=topology.master_addr, master_port=opts.main_process_port, created=time.time(),
                     env=tuple(sorted(env.items())), controlled=(rank,))
    if rank == 0 and run.has_state():
        state = dataclasses.replace(run.read_state(), controlled=(0,), backend="platform")
    ctrl = RunController.open(run, pool, purpose=f"platform node {rank}",
                              lock_name=None if rank == 0 else f"lock.node-{rank}", state=state)
    try:
        if args.grace:
            ctrl.grace_s = args.grace
        resume = None
        from trainer import checkpoint as ckpt

        if ckpt.scan(run.checkpoints).newest is not None:
            resume = "latest"  # a re-run Job continues where the last one stopped
            view.note("resuming from the newest complete checkpoint")
        try:
            ctrl.launch(resume=resume)
        except LaunchError as err:
            view.note(f"launch failed: {err}")
            return report_outcome(ctrl, ctrl.outcome(), view)
        view.note(f"node {rank} of {nodes} started (machine rank {rank}, master {opts.main_process_ip}:"
                  f"{opts.main_process_port})")
        return follow(ctrl, view, args.grace)
    finally:
        ctrl.close()
