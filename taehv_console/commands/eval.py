"""`taehv-console eval WEIGHTS|RUN --data DIR`: score weights of any TAE family on any videos (PSNR,
SSIM, the temporal figure, two baselines), beside a second set of weights of the same clip rule
(--compare: one family, or its base and super decoders) and, given the family's teacher (--teacher),
beside the teacher's own reconstruction and as a decoder of its latents; a contact sheet PNG and
every figure as JSON, each naming the family.

Imports nothing heavy at module level: the scoring (torch, PyAV) is imported when it runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.table import Table

from taehv_console.commands.options import COUNT, LIMIT, add_option
from taehv_console.core.run.rundir import RunNotFoundError, resolve_run
from taehv_console.core.values import InputError
from taehv_console.exit_codes import CRASHED_MEANING, ExitCode
from trainer.families import CUSTOM, FAMILIES  # the table only: no torch

EXIT_CODES = {
    ExitCode.DONE: "scored; the contact sheet and the JSON were written",
    ExitCode.USAGE: "wrong command line; no such weights, run or teacher; weights that are not TAEHV's, "
    "of an unknown family, of shapes that fit several families with nothing naming one (the error "
    "lists them), or not of the family their name, metadata or --family says; --frames/--size the "
    "family cannot encode exactly (the error says the nearest that work); --compare weights of "
    "another clip rule; a teacher of another family (the error names the one it fits) or one that "
    "cannot code the clip; no readable video; a --device this machine lacks",
    ExitCode.CRASHED: CRASHED_MEANING,
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        metavar="WEIGHTS|RUN",
        help="a .safetensors/.pth file, a run (directory or id under --runs: scores final/), its "
        "final/ or best/, or a checkpoint's step-<N>/",
    )
    add_option(parser, "data", required=True, help="folder of videos or annotation JSON to score on")
    parser.add_argument(
        "--compare",
        metavar="WEIGHTS",
        help="second weights (same forms) scored beside on the same clips: the same family, its base "
        "or super decoder (taew2_2 vs taew2_2_super), or another family of the same clip rule",
    )
    parser.add_argument(
        "--teacher",
        metavar="DIR",
        help="the family's teacher VAE (a local diffusers folder): also score its own reconstruction "
        "and decoding its latents",
    )
    parser.add_argument(
        "--family",
        metavar="NAME",
        help="the weights' family where the file does not say it (metadata, then name); needed when "
        "its shapes fit several (taehv, taew2_1, taecvx)",
    )
    parser.add_argument(
        "--frames",
        type=COUNT,
        metavar="N",
        help="frames per clip, in whole frame quanta of the family: 4 (LTX 8, H3 17-frame chunks) "
        "(default: the run's, else 12 rounded up: LTX 16, H3 17)",
    )
    parser.add_argument(
        "--size",
        metavar="HxW",
        help="clip size, multiples of the family's 8 x patch (default: the run's crop, else whole frames "
        "rounded down to it)",
    )
    parser.add_argument(
        "--clips", type=LIMIT, default=0, metavar="N", help="score at most N videos (default all)"
    )
    parser.add_argument("--best", action="store_true", help="with a run: score best/ instead of final/")
    parser.add_argument(
        "--no-ema",
        action="store_true",
        help="score the raw weights where the run also kept an EMA (by default the EMA's: what chose best/)",
    )
    parser.add_argument(
        "--streaming", action="store_true", help="run the model frame by frame (bounded memory)"
    )
    parser.add_argument("--device", metavar="D", help="torch device (default: cuda when present, else cpu)")
    parser.add_argument(
        "--out", metavar="DIR", help="where the PNG and JSON go (default RUN/eval/, or beside the weights)"
    )
    add_option(parser, "runs")
    add_option(parser, "json", help="print every figure as JSON")


_W = TypeVar("_W")  # what the trainer's resolve_weights returns (torch stays out of --help)


def _weights(target: str, runs: str, best: bool, resolve_weights: Callable[[str, bool], _W]) -> _W:
    """A path as given, else a run id (or unique prefix) under --runs."""
    if Path(target).expanduser().exists() or "/" in target:
        return resolve_weights(target, best)
    try:
        return resolve_weights(str(resolve_run(target, runs).path), best)
    except RunNotFoundError:
        return resolve_weights(target, best)  # says: no such weights file or run directory


def _size(text: str, parse_size: Callable[[str], tuple[int, int]]) -> tuple[int, int]:
    try:
        return parse_size(text)
    except ValueError as err:
        raise InputError(f"--size {err}") from None


def _family(name: str) -> str:
    if name not in (*FAMILIES, CUSTOM):
        raise InputError(f"--family {name!r}: unknown family; known: {', '.join([*FAMILIES, CUSTOM])}")
    return name


def run(args: argparse.Namespace) -> ExitCode:
    # the trainer's errors (weights, data, teacher, eval's own) name the file: cli.main says them, 2
    # torch and PyAV only now: `eval --help` stays light
    from trainer.eval_report import write_report
    from trainer.evaluate import resolve_weights, score
    from trainer.synthetic import parse_size

    err_console = Console(stderr=True)
    try:
        resolve = functools.partial(resolve_weights, ema=not args.no_ema)
        primary = _weights(args.target, args.runs, args.best, resolve)
        compare = _weights(args.compare, args.runs, False, resolve) if args.compare else None
        result = score(
            primary,
            args.data,
            family=_family(args.family) if args.family else None,
            compare=compare,
            teacher=args.teacher,
            frames=args.frames,
            size=_size(args.size, parse_size) if args.size else None,
            streaming=args.streaming,
            limit=args.clips,
            device=args.device,
            progress=(lambda line: None)
            if args.json
            else (lambda line: err_console.print(line, highlight=False)),
        )
        report = write_report(result, Path(args.out) if args.out else None)
    except OSError as err:
        print(f"error: {err.filename or ''}: {err.strerror or err}", file=sys.stderr)
        return ExitCode.USAGE
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)
    return ExitCode.DONE


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _print_table(report: dict) -> None:
    console = Console()
    for m in report["models"]:
        console.print(
            f"[bold]{m['label']}[/] (family {m['family']}): {m['weights']}  ({m['config']})", highlight=False
        )
    if "teacher" in report:
        t = report["teacher"]
        console.print(f"[bold]teacher[/] {t['class']}: {t['path']}", highlight=False)
    families = list(dict.fromkeys(m["family"] for m in report["models"]))
    table = Table(
        title=f"{'family' if len(families) == 1 else 'families'} {' vs '.join(families)}: {len(report['clips'])} clip(s) from {report['data']}: "
        f"{report['frames']} frames ({report['scored_frames']} scored) at {report['height']}x{report['width']}"
    )
    teacher = "teacher" in report["models"][0]
    columns = ["", "PSNR dB", "SSIM", "temporal PSNR dB"]
    columns += ["decoding teacher latents, PSNR dB vs teacher / vs input"] if teacher else []
    for column in columns:
        table.add_column(column, justify="right" if column else "left")
    for m in report["models"]:
        o = m["overall"]
        row = [m["label"], _num(o["psnr"]), _num(o["ssim"], 4), _num(o["temporal_psnr"])]
        if teacher:
            row.append(f"{_num(m['teacher']['psnr_vs_teacher'])} / {_num(m['teacher']['psnr_vs_input'])}")
        table.add_row(*row)
    for name, text in (("mid_grey", "mid-grey output"), ("mean_colour", "each clip's mean colour")):
        b = report["baselines"][name]
        table.add_row(f"[dim]{text}[/]", _num(b["psnr"]), _num(b["ssim"], 4), _num(b["temporal_psnr"]))
    if "teacher" in report:
        o = report["teacher"]["overall"]
        table.add_row(
            f"[dim]the teacher's own encode + decode ({report['teacher']['class']})[/]",
            _num(o["psnr"]),
            _num(o["ssim"], 4),
            _num(o["temporal_psnr"]),
        )
    console.print(table)
    for s in report["skipped"]:
        console.print(f"skipped {s['path']}: {s['reason']}", highlight=False)
    console.print(f"contact sheet: {report['contact_sheet']}\nfigures: {report['json']}", highlight=False)
