"""`taehv-console --no-tui`: the console's flow without a screen, on the same core as the TUI.

detect -> preflight (errors end it: exit PREFLIGHT_FAILED, findings printed) -> preset (auto, or
--preset) -> launch, or attach when this run is already live -> progress until the run ends.
SIGTERM/SIGINT stop the whole run gracefully (checkpoint), then exit STOPPED; a second signal cuts
the grace period short. On a machine without GPUs and without --data the cpu-smoke preset trains
on generated clips, so the README's main command works on a laptop.

Progress: a rich progress bar when stdout is a terminal, timestamped lines otherwise (container
logs), and with --json one JSON object per line (trainer events as they are, plus the console's
own `phase`, `note` and a final `result`). Each validation's samples are named once, when
their index.json appears: the step's directory and each clip's PSNR, PNG and video.

Imported on the --no-tui path and by the commands that follow a run, not by `taehv-console --help`
(its exit codes live in exit_codes.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from taehv_console.core.cluster.hosts import HostfileError, InvalidHostError
from taehv_console.core.cluster.platform import TopologyError
from taehv_console.core.cluster.ssh import SshPool
from taehv_console.core.flow.config import run_config
from taehv_console.core.flow.detect import detect
from taehv_console.core.flow.launch import PlatformNode, PlatformRunError, launch_spec, prepare_platform_node
from taehv_console.core.flow.options import FlowOptions
from taehv_console.core.flow.preflight import NOT_PER_PROCESS, backend_for, preflight
from taehv_console.core.flow.runs import find_live_run
from taehv_console.core.models import BackendKind, PreflightReport
from taehv_console.core.run.control import RunController
from taehv_console.core.run.create import LaunchSpec, create_run
from taehv_console.core.run.lock import RunBusyError
from taehv_console.core.run.outcome import LaunchError, Outcome, RunLiveError, RunSnapshot
from taehv_console.core.run.recovery import recoveries
from taehv_console.core.run.rundir import RunDir, RunNotFoundError, resolve_run
from taehv_console.core.watch.monitor import snapshot_once
from taehv_console.core.watch.runwatch import RunWatch
from taehv_console.core.watch.samples import SampleStep, list_sample_steps, newest_samples
from taehv_console.core.watch.state import ForensicsSummary, RunView
from taehv_console.core.watch.view import StallText, headline, number_text, progress_dict, stall_texts
from taehv_console.exit_codes import EXIT_CODES_HELP, ExitCode, exit_code_for  # noqa: F401 - re-exported
from trainer import checkpoint as ckpt
from trainer.config import ConfigError, TrainConfig

# --------------------------------------------------------------------------------------- views
# Every view renders the RunView of the run's one watch pipeline (core/watch): phase, progress,
# ETA, stalls and their forensics read the same here as in the TUI and `status`. The controller's
# snapshot adds only what the console itself did (notes) and the trainer's events as they are.


def _num(value: float | None, fmt: str) -> str:
    return number_text(value, fmt)


class View(Protocol):
    """What the flow tells a view (PlainView, RichView, JsonView): notes, each snapshot of the run
    with its RunView, and the end."""

    def note(self, text: str) -> None: ...
    def update(self, snap: RunSnapshot, view: RunView | None = None) -> None: ...
    def close(self) -> None: ...


class _Watched:
    """What a view has already said about the RunView, so each stall, recovery and forensics
    report is told once."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.stalled: dict[int, str] = {}  # rank -> the detail it was named with
        self.reports: set[str] = set()

    def changes(self, view: RunView) -> tuple[list[StallText], list[int], list[ForensicsSummary]]:
        """(newly stalled StallTexts, ranks no longer stalled, new forensics summaries)."""
        now = {s.rank: s for s in stall_texts(view)}
        new = [s for r, s in now.items() if r not in self.stalled]
        cleared = [r for r in self.stalled if r not in now]
        self.stalled = {r: s.detail for r, s in now.items()}
        reports = [f for f in view.forensics if f.report not in self.reports]
        self.reports.update(f.report for f in reports)
        return new, cleared, reports


class _NewSamples:
    """The newest reconstruction samples, told once per step validation writes them."""

    def __init__(self) -> None:
        self._listed: int | None = None  # the newest complete step seen in the listing
        self._told: int | None = None

    def check(self, run_dir: str) -> SampleStep | None:
        steps = list_sample_steps(run_dir)  # a directory listing: cheap enough for every update
        if not steps or steps[0] == self._listed:
            return None
        self._listed = steps[0]
        newest = newest_samples(run_dir)  # a broken index is passed over for the one before
        if newest is None or newest.step == self._told:
            return None
        self._told = newest.step
        return newest


def samples_lines(step: SampleStep) -> list[str]:
    """Where the newest samples are: the step's directory, then each clip's PSNR, PNG and video."""
    lines = [f"samples step {step.step}: {step.path}"]
    for c in step.clips:
        files = " ".join(str(p) for p in (c.png, c.video) if p is not None)
        lines.append(f"  clip {c.index}: PSNR {c.psnr_text}  {files}")
    return lines


def _frames_lines(summary: ForensicsSummary, top: int = 6) -> list[str]:
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
        self._samples = _NewSamples()

    def _line(self, text: str) -> None:
        self.out.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
        self.out.flush()

    def note(self, text: str) -> None:
        self._line(text)

    def update(self, snap: RunSnapshot, view: RunView | None = None) -> None:
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

    def health(self, view: RunView) -> None:
        """The phase, stalls, forensics and new samples, each told once."""
        newest = self._samples.check(view.run.run_dir)
        for line in samples_lines(newest) if newest is not None else ():
            self._line(line)
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
    def progress_text(view: RunView) -> str:
        return headline(view).text

    def close(self) -> None:
        return None


class RichView(PlainView):
    """A progress bar (step, loss, PSNR, clips/s, ETA) with notes, stalls and forensics above it."""

    def __init__(self, out: TextIO):
        super().__init__(out)

        self.console = Console(file=out)
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            console=self.console,
            transient=False,
        )
        self.task = self.bar.add_task("starting", total=None, stats="")
        self.bar.start()

    def _line(self, text: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/] {text}", highlight=False, markup=False)

    def update(self, snap: RunSnapshot, view: RunView | None = None) -> None:
        for note in snap.notes:
            self._line(note)
        for e in snap.events:
            if e.get("kind") == "checkpoint" and e.get("rank") == 0 and e.get("status") == "complete":
                self._line(f"checkpoint step {e.get('step')}")
            elif e.get("kind") == "error":
                self._line(f"rank {e.get('rank')} error: {str(e.get('message', ''))[:300]}")
        if view is None:
            return

        self.health(view)
        h = headline(view)
        stats = f"loss {h.loss}  psnr {h.psnr} dB  {h.clips_per_s} clips/s  eta {h.eta}"
        self.bar.update(
            self.task,
            completed=view.run.step or 0,
            total=view.run.max_steps,
            description=h.phase,
            stats=stats,
        )

    def close(self) -> None:
        self.bar.stop()


class JsonView:
    """One JSON object per line: trainer events verbatim (`source: trainer`) and the console's
    own (`source: console`: phase, note, samples, stall, recovered, forensics, health, result)."""

    def __init__(self, out: TextIO):
        self.out = out
        self._seen = _Watched()
        self._samples = _NewSamples()
        self._health: tuple[tuple[int, str, int | None], ...] | None = None

    def emit(self, obj: Mapping[str, Any]) -> None:
        self.out.write(json.dumps(obj, default=str) + "\n")
        self.out.flush()

    def note(self, text: str) -> None:
        self.emit({"source": "console", "kind": "note", "time": time.time(), "message": text})

    def update(self, snap: RunSnapshot, view: RunView | None = None) -> None:
        for note in snap.notes:
            self.note(note)
        for e in snap.events:
            self.emit({"source": "trainer", **e})
        if view is None:
            return

        t = time.time()
        base = {"source": "console", "time": t, "run": view.run.run_id}
        if view.run.phase != self._seen.phase:
            self._seen.phase = view.run.phase
            self.emit(
                {
                    **base,
                    "kind": "phase",
                    "phase": view.run.phase,
                    "attempt": snap.attempt,
                    "progress": progress_dict(view),
                }
            )
        newest = self._samples.check(view.run.run_dir)
        if newest is not None:
            self.emit({**base, "kind": "samples", **newest.to_dict()})
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
            self.emit(
                {
                    **base,
                    "kind": "health",
                    "ranks": [
                        {
                            "rank": r.rank,
                            "node": r.node,
                            "state": r.state.value,
                            "step": r.step,
                            "blocked_by": r.blocked_by,
                            "heartbeat_age_s": r.heartbeat_age_s,
                            "score": r.score,
                            "waiting_s": r.waiting_s,
                            "detail": r.detail,
                        }
                        for r in view.ranks
                    ],
                }
            )

    def result(self, obj: Mapping[str, Any]) -> None:
        self.emit({"source": "console", "kind": "result", "time": time.time(), **obj})

    def close(self) -> None:
        return None


def make_view(json_mode: bool, out: TextIO | None = None) -> View:
    out = out or sys.stdout
    if json_mode:
        return JsonView(out)
    if out.isatty():
        return RichView(out)
    return PlainView(out)


# ---------------------------------------------------------------------------------- following


class _Signals:
    """SIGTERM/SIGINT -> a graceful stop of the run; a second one cuts the grace short."""

    def __init__(self, view: View):
        self.view = view
        self.count = 0
        self.ctrl: RunController | None = None
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            self.view.note(
                f"{signal.Signals(signum).name}: stopping the whole run (checkpoint first); "
                "send it again to skip the wait"
            )
        elif self.ctrl is not None:
            self.ctrl.hurry = True

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


def follow(ctrl: RunController, view: View, grace_s: float | None = None) -> ExitCode:
    """Follow a launched or attached run to its end, rendering the run's RunView (its one watch
    pipeline, with stall forensics) into `view`; SIGTERM/SIGINT stop it gracefully. Returns the
    ExitCode of its outcome and prints a summary."""
    if grace_s is not None:
        ctrl.grace_s = grace_s
    sigs = _Signals(view)
    sigs.ctrl = ctrl
    sigs.install()
    watch = RunWatch.for_controller(ctrl).start()
    try:
        outcome = ctrl.follow(
            lambda snap: view.update(snap, watch.view()),
            should_stop=lambda: sigs.count > 0,
            stalls=watch.stalls,
        )
        view.update(ctrl.snapshot(), watch.final_view())
    finally:
        watch.stop()
        sigs.restore()
    view.close()
    return report_outcome(ctrl, outcome, view, watch.final_view())


def report_ended(ctrl: RunController, view: View) -> ExitCode:
    """A run that is not running (any more): its RunView read once, then how it ended."""
    run_view = snapshot_once(ctrl.run.path)
    view.update(ctrl.snapshot(), run_view)
    return report_outcome(ctrl, ctrl.outcome(), view, run_view)


def report_outcome(
    ctrl: RunController, outcome: Outcome, view: View, run_view: RunView | None = None
) -> ExitCode:
    code = exit_code_for(outcome.phase, final=outcome.final)
    summary = outcome_dict(ctrl, outcome, code, run_view)
    if isinstance(view, JsonView):
        view.result(summary)
        return code
    p = summary["progress"]
    view.note(
        f"{ctrl.run.run_id}: {outcome.phase.value} at step {p.get('step')}"
        f"/{p.get('max_steps')} (exit {code.value} {code.name.lower()})"
    )
    if outcome.failure is not None:
        view.note(f"failure: {outcome.failure.summary()}")
        for line in outcome.failure.log_lines:
            view.note(f"  | {line}")
    if outcome.stop is not None and outcome.phase.value == "stopped":
        s = outcome.stop
        view.note(
            f"stop: checkpoint at step {s.checkpoint_step}"
            if s.checkpoint_step is not None
            else "stop: no checkpoint was written by this stop"
        )
        view.note("resume with: taehv-console resume " + str(ctrl.run.path))
    if outcome.final_weights:
        view.note(f"weights: {outcome.final_weights}")
    return code


def outcome_dict(
    ctrl: RunController, outcome: Outcome, code: ExitCode, run_view: RunView | None = None
) -> dict[str, Any]:
    progress = {**(progress_dict(run_view) if run_view is not None else {}), **dict(outcome.progress)}
    return {
        "run": ctrl.run.run_id,
        "run_dir": str(ctrl.run.path),
        "phase": outcome.phase.value,
        "exit_code": int(code),
        "exit_name": code.name.lower(),
        "progress": progress,
        "failure": asdict(outcome.failure) if outcome.failure else None,
        "stop": asdict(outcome.stop) if outcome.stop else None,
        "final_weights": outcome.final_weights,
        "recoveries": [asdict(r) for r in recoveries(ctrl.state.attempts)],
    }


# ------------------------------------------------------------------------------------- the flow


def _fail(view: View, code: ExitCode, message: str) -> ExitCode:
    if isinstance(view, JsonView):
        view.result({"phase": None, "exit_code": int(code), "exit_name": code.name.lower(), "error": message})
    else:
        print(f"taehv-console: {message}", file=sys.stderr)
    return code


def run(options: FlowOptions, json_mode: bool = False) -> int:
    """The whole headless flow; returns an ExitCode."""
    view = make_view(json_mode)
    try:
        return int(_run(options, view))
    except KeyboardInterrupt:
        # before `follow` took over the signals: detection, preflight or the launch itself
        return _fail(
            view,
            ExitCode.INTERRUPTED,
            "interrupted; a run already launched keeps running "
            "(see `taehv-console status`, stop it with `taehv-console stop`)",
        )
    finally:
        view.close()


class _Refused(Exception):
    def __init__(self, code: ExitCode, message: str):
        super().__init__(message)
        self.code = code


def _run(options: FlowOptions, view: View) -> ExitCode:
    if not options.run and options.preset.endswith("run.toml") and os.path.isfile(options.preset):
        # a platform pod: the rendered run's directory is the run
        options = dataclasses.replace(options, run=os.path.dirname(os.path.abspath(options.preset)))
    with SshPool(options.ssh) as pool:
        existing = None
        if options.run:
            try:
                existing = resolve_run(options.run, options.runs)
            except RunNotFoundError as err:
                return _fail(view, ExitCode.USAGE, str(err))
        try:
            view.note("detecting the cluster")
            found = detect(options, pool)
        except (TopologyError, InvalidHostError, HostfileError) as err:
            return _fail(view, ExitCode.USAGE, str(err))
        topology, probes = found.topology, found.probes
        backend = backend_for(options, topology)
        if backend is None:
            return _fail(view, ExitCode.USAGE, NOT_PER_PROCESS)
        try:
            # 1. a run that is already live: attach to it, never launch it twice
            if backend is not BackendKind.PLATFORM:
                candidate = existing if existing is not None and existing.has_state() else None
                if existing is None:
                    hosts = tuple(topology.hosts) if topology.uses_ssh else ("localhost",)
                    live = find_live_run(options.runs, pool, hosts=hosts)
                    candidate = RunDir(Path(live.path)) if live is not None else None
                if candidate is not None:
                    code = _attach_if_live(candidate, pool, view, options, named=existing is not None)
                    if code is not None:
                        return code
            # 2. config, preflight
            chosen = run_config(options, topology, probes, existing, view.note)
            if backend is BackendKind.SBATCH:
                # SLURM picks the nodes after submission: nothing here to check them against
                view.note("sbatch: preflight skipped (run `taehv-console preflight` inside an allocation)")
                spec = launch_spec(options, topology, backend, options.master_port or 29500, pool)
                return _launch_new(options, chosen.config, spec, pool, view, existing)
            checked = preflight(options, topology, probes, chosen, pool, view.note)
            _print_findings(view, checked.report, checked.chosen)
            if not checked.report.ok:
                return ExitCode.PREFLIGHT_FAILED
            # 3. launch
            if backend is BackendKind.PLATFORM:
                node = prepare_platform_node(options, topology, checked.config, existing, checked.master_port)
                return _platform(node, options, pool, view)
            spec = launch_spec(options, topology, backend, checked.master_port, pool)
            return _launch_new(options, checked.config, spec, pool, view, existing)
        except RunBusyError as err:
            return _fail(view, ExitCode.BUSY, str(err))
        except (ConfigError, PlatformRunError) as err:
            return _fail(view, ExitCode.USAGE, str(err))
        except _Refused as err:
            return _fail(view, err.code, str(err))


def _attach_if_live(
    run: RunDir, pool: SshPool, view: View, options: FlowOptions, named: bool
) -> ExitCode | None:
    """Attach when the run's processes are alive (RunBusyError when another console has it);
    None when the run should be launched (not live, never started)."""
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
        return follow(ctrl, view, options.grace_s)
    finally:
        ctrl.close()


def _print_findings(view: View, report: PreflightReport, chosen: str) -> None:
    if isinstance(view, JsonView):
        view.emit(
            {
                "source": "console",
                "kind": "preflight",
                "time": time.time(),
                "config": chosen,
                **report.to_dict(),
            }
        )
        return
    view.note(f"config: {chosen}")
    for f in report.findings:
        if f.severity.value == "info":
            continue
        view.note(f"{f.severity.value}: {f.message}" + (f" (fix: {f.fix})" if f.fix else ""))
    if not report.ok:
        view.note(f"preflight: {len(report.errors)} error(s); nothing was started")


def _launch_new(
    options: FlowOptions,
    cfg: TrainConfig,
    spec: LaunchSpec,
    pool: SshPool,
    view: View,
    existing: RunDir | None,
) -> ExitCode:
    run = create_run(options.runs, cfg, spec, run=existing)
    view.note(f"run {run.run_id} in {run.path}")
    ctrl = RunController.open(run, pool, purpose="launch (--no-tui)")
    try:
        if options.grace_s:
            ctrl.grace_s = options.grace_s  # before the launch: torchrun's own shutdown wait follows it
        try:
            ctrl.launch()
        except RunLiveError as err:
            raise _Refused(ExitCode.BUSY, str(err)) from None
        except LaunchError as err:
            view.note(f"launch failed: {err}")
            return report_outcome(ctrl, ctrl.outcome(), view)
        attempt = ctrl.attempt
        assert attempt is not None  # launch() recorded its attempt
        for line in ctrl.backend.describe(attempt):
            view.note(line)
        return follow(ctrl, view, options.grace_s)
    finally:
        ctrl.close()


def _platform(node: PlatformNode, options: FlowOptions, pool: SshPool, view: View) -> ExitCode:
    """A pod/container: launch this node (machine rank = the platform's node index); node 0 also
    records the run's state and reports on every node, the others follow their own node."""
    run, rank = node.run, node.rank
    ctrl = RunController.open(
        run,
        pool,
        purpose=f"platform node {rank}",
        lock_name=None if rank == 0 else f"lock.node-{rank}",
        state=node.state,
    )
    try:
        if options.grace_s:
            ctrl.grace_s = options.grace_s
        resume = None
        if ckpt.scan(run.checkpoints).newest is not None:
            resume = "latest"  # a re-run Job continues where the last one stopped
            view.note("resuming from the newest complete checkpoint")
        try:
            ctrl.launch(resume=resume)
        except LaunchError as err:
            view.note(f"launch failed: {err}")
            return report_outcome(ctrl, ctrl.outcome(), view)
        view.note(
            f"node {rank} of {node.nodes} started (machine rank {rank}, master {node.master_addr}:"
            f"{node.master_port})"
        )
        return follow(ctrl, view, options.grace_s)
    finally:
        ctrl.close()
