"""Following a run without a screen: how its progress is printed (plain timestamped lines, a rich
bar on a terminal, or JSON lines with --json) and how it ended, for `--no-tui` and the commands
that follow a run (`attach`, `resume`, `stop`). SIGTERM/SIGINT while following stop the whole run
gracefully; a second one cuts the grace period short.

Each validation's samples are named once, when their index.json appears: the step's directory and
each clip's PSNR, PNG and video.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from types import FrameType
from typing import Any, Protocol, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from taehv_console.core.run import supervision
from taehv_console.core.run.client import RunClient, client_mode
from taehv_console.core.run.control import RunController
from taehv_console.core.run.outcome import ControlError, Outcome, RunSnapshot
from taehv_console.core.run.recovery import recoveries
from taehv_console.core.watch.monitor import snapshot_once
from taehv_console.core.watch.runwatch import RunWatch
from taehv_console.core.watch.samples import SampleStep, list_sample_steps, newest_samples
from taehv_console.core.watch.state import ForensicsSummary, RunView
from taehv_console.core.watch.view import StallText, headline, number_text, progress_dict, stall_texts
from taehv_console.exit_codes import ExitCode, exit_code_for

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
        lines.append("  no stack: " + ("; ".join(summary.notes) or "no tool gave one"))
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
        mfu = f"  MFU {h.mfu}{' (low)' if h.slow else ''}" if h.mfu else ""
        stats = f"loss {h.loss}  psnr {h.psnr} dB  {h.clips_per_s} clips/s{mfu}  eta {h.eta}"
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
    """SIGTERM/SIGINT -> a graceful stop of the run; a second one cuts the grace short. SIGTSTP
    (Ctrl-Z) -> the console says who keeps the run meanwhile, then stops (see _pause)."""

    def __init__(self, view: View):
        self.view = view
        self.count = 0
        self.suspend = False
        self.ctrl: RunController | None = None  # a console controlling the run: told to hurry
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._old[sig] = signal.signal(sig, self._handle)
        self._old[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, self._tstp)

    def _tstp(self, _signum: int, _frame: FrameType | None) -> None:
        self.suspend = True

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


def _pause(view: View, sigs: _Signals, keeper: str) -> None:
    """Ctrl-Z while following: say who keeps the run while this console is stopped, stop here
    until SIGCONT (`fg`), then go on following."""
    sigs.suspend = False
    view.note(f"suspended: {keeper}; `fg` to follow it again")
    signal.signal(signal.SIGTSTP, signal.SIG_DFL)
    try:
        signal.raise_signal(signal.SIGTSTP)  # stopped here until SIGCONT
    finally:
        signal.signal(signal.SIGTSTP, sigs._tstp)
    view.note("continued")


def follow_run(ctrl: RunController, view: View, grace_s: float | None = None) -> ExitCode:
    """Follow a run this console launched, resumed or opened: as its supervisor's client where a
    supervisor keeps the run (core/run/client.py; the lock goes to the supervisor), else under
    this console's control."""
    if grace_s is not None:
        ctrl.grace_s = grace_s
    if client_mode(ctrl.kind):
        return follow_client(RunClient.hand_over(ctrl), view)
    return follow(ctrl, view)


def follow_client(client: RunClient, view: View) -> ExitCode:
    """Follow a supervised run to its end as the supervisor's client, rendering its RunView into
    `view`: SIGTERM/SIGINT ask the supervisor to stop it (a second one, to hurry), Ctrl-Z stops
    only this console. Returns the ExitCode of how the run ended and prints a summary."""
    sigs = _Signals(view)
    sigs.install()
    watch = RunWatch.for_client(client).start()
    keeper = f"the run's supervisor controls it (its log: {supervision.log_path(client.run)})"

    def update(snap: RunSnapshot) -> None:
        view.update(snap, watch.view())
        if sigs.suspend:
            _pause(view, sigs, keeper)

    try:
        try:
            outcome = client.follow(update, should_stop=lambda: sigs.count > 0, hurry=lambda: sigs.count > 1)
        except ControlError as err:
            view.note(str(err))
            view.close()
            return ExitCode.FAILED
        final = watch.final_view()
        view.update(client.snapshot(), final)
    finally:
        watch.stop()
        sigs.restore()
    view.close()
    return report_outcome(client, outcome, view, final)


def follow(ctrl: RunController, view: View, grace_s: float | None = None) -> ExitCode:
    """Follow a launched or attached run to its end under this console's control, rendering the
    run's RunView (its one watch pipeline, with stall forensics) into `view`; SIGTERM/SIGINT stop it
    gracefully. Returns the ExitCode of its outcome and prints a summary."""
    if grace_s is not None:
        ctrl.grace_s = grace_s
    sigs = _Signals(view)
    sigs.ctrl = ctrl
    sigs.install()
    keeper = "no supervisor runs for this run, so nothing recovers it until `fg`"

    def update(snap: RunSnapshot) -> None:
        view.update(snap, watch.view())
        if sigs.suspend and sigs.count == 0:  # a stop in progress is finished first
            _pause(view, sigs, keeper)

    watch = RunWatch.for_controller(ctrl).start()
    try:
        outcome = ctrl.follow(
            update, should_stop=lambda: sigs.count > 0, stalls=watch.stalls, hardware=watch.hardware
        )
        final = watch.final_view()
        view.update(ctrl.snapshot(), final)
    finally:
        watch.stop()
        sigs.restore()
    view.close()
    return report_outcome(ctrl, outcome, view, final)


def report_ended(ctrl: RunController | RunClient, view: View) -> ExitCode:
    """A run that is not running (any more): its RunView read once, then how it ended."""
    run_view = snapshot_once(ctrl.run.path)
    view.update(ctrl.snapshot(), run_view)
    return report_outcome(ctrl, ctrl.outcome(), view, run_view)


def report_outcome(
    ctrl: RunController | RunClient, outcome: Outcome, view: View, run_view: RunView | None = None
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
    ctrl: RunController | RunClient, outcome: Outcome, code: ExitCode, run_view: RunView | None = None
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
        "exclusions": [asdict(e) for e in ctrl.state.exclusions],
    }
