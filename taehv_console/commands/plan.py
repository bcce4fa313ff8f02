"""`taehv-console plan`: communication, time, cost and memory figures for a preset or topology.

Without --preset and topology: the comparison table of the shipped GPU presets against the 8-GPU
baseline (the shape of the public project's table). Imports nothing heavy (torch, Textual).
"""

from __future__ import annotations

import argparse
import json
import sys

from rich import box
from rich.console import Console
from rich.table import Table

from taehv_console.commands.options import AMOUNT, COUNT, FRACTION, POSITIVE, add_option
from taehv_console.core.plan.derive import ResolvedConfig, resolve_config
from taehv_console.core.plan.planner import (
    CHECKPOINT_FIXED_S,
    GB,
    LLAMA3_FAILURES_PER_GPU_HOUR,
    LLAMA3_SOURCE,
    RESTART_S,
    ComparisonRow,
    Plan,
    checkpoint_lines,
    compare_plans,
    format_duration,
    make_plan,
    model_summary,
    parse_bandwidth,
    plan_to_dict,
    teacher_lines,
)
from taehv_console.core.plan.presets import PresetMeta, list_presets, load_preset
from taehv_console.core.run.recovery import policy_lines
from taehv_console.core.values import InputError
from taehv_console.exit_codes import CRASHED_MEANING, ExitCode
from trainer.config import ConfigError

BASELINE = "8gpu-h100"
EXIT_CODES = {
    ExitCode.DONE: "shown; the config fits in GPU memory (the comparison table: always)",
    ExitCode.FAILED: "shown, but the config does not fit in GPU memory",
    ExitCode.USAGE: "wrong command line, config or value",
    ExitCode.CRASHED: CRASHED_MEANING,
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


def register(parser: argparse.ArgumentParser) -> None:
    add_option(
        parser,
        "preset",
        default=None,  # none: the comparison table of the shipped presets
        help="preset name or .toml path ('auto' with --nodes/--gpus-per-node)",
    )
    parser.add_argument("--nodes", type=COUNT, help="machines taking part (derive for this topology)")
    parser.add_argument("--gpus-per-node", type=COUNT, help="GPUs (training processes) per machine")
    parser.add_argument("--gpu", default="", help="GPU model, e.g. 'H100' or 'A800' (throughput, auto)")
    parser.add_argument("--gpu-memory-gb", type=POSITIVE, help="memory per GPU, GB")
    parser.add_argument("--bandwidth", help="inter-node bandwidth, e.g. 25Gbit, 100Gbps, 10GB/s")
    parser.add_argument(
        "--throughput", type=POSITIVE, help="measured clips/s per GPU (default: documented assumption)"
    )
    parser.add_argument("--efficiency", type=FRACTION, default=1.0, help="scaling efficiency on compute, 0-1")
    parser.add_argument(
        "--target-comm", type=POSITIVE, default=0.10, help="target communication fraction (0.10)"
    )
    parser.add_argument("--price", type=AMOUNT, help="price per GPU-hour, for a cost column")
    parser.add_argument(
        "--failure-rate",
        type=POSITIVE,
        metavar="PER_GPU_HOUR",
        help=f"interruptions per GPU-hour, for the checkpoint interval (default {LLAMA3_FAILURES_PER_GPU_HOUR:.3g}, "
        "Meta's Llama 3 report: 419 in 54 days on 16,384 H100s)",
    )
    add_option(parser, "overrides", help="override a config value, e.g. optim.lr=2e-4; repeatable")
    add_option(parser, "json", help="print JSON")


def _plan_kwargs(args: argparse.Namespace, bandwidth_text: str | None) -> dict:
    if not 0 < args.target_comm < 1:
        raise InputError(f"--target-comm {args.target_comm}: a fraction between 0 and 1, e.g. 0.1")
    if args.throughput is not None and args.throughput <= 0:
        raise InputError(f"--throughput {args.throughput}: clips per second per GPU, more than 0")
    if args.failure_rate is not None and not 0 < args.failure_rate < 1:
        raise InputError(
            f"--failure-rate {args.failure_rate:g}: interruptions per GPU-hour, more than 0 and under 1, "
            f"e.g. {LLAMA3_FAILURES_PER_GPU_HOUR:.2e}"
        )
    return {
        "bandwidth_bits_per_s": parse_bandwidth(bandwidth_text) if bandwidth_text else None,
        "clips_per_s_per_gpu": args.throughput,
        "efficiency": args.efficiency,
        "target_fraction": args.target_comm,
        "price_per_gpu_hour": args.price,
        "failures_per_gpu_hour": args.failure_rate,
    }


def run(args: argparse.Namespace) -> ExitCode:
    # a wrong config or value (ConfigError, InputError) is said by cli.main: 2 (errors.py)
    if args.preset is None and args.nodes is None and args.gpus_per_node is None:
        return _comparison(args)

    resolved = resolve_config(
        args.preset,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_name=args.gpu,
        gpu_memory_gb=args.gpu_memory_gb,
        overrides=args.overrides,
    )
    cfg = resolved.config
    meta = _meta(resolved.preset) or _meta(args.preset)
    meta_gpu = args.gpu or (meta.gpu if meta else "")
    network = (meta.network if meta else "") or None
    kwargs = _plan_kwargs(args, args.bandwidth or network)
    plan = make_plan(cfg, name=cfg.run.preset, gpu=meta_gpu, **kwargs)
    baseline_preset = load_preset(BASELINE)
    baseline = make_plan(
        baseline_preset.config, name=BASELINE, gpu="H100", **{**kwargs, "clips_per_s_per_gpu": None}
    )
    row = compare_plans([plan], baseline)[0]

    if args.json:
        out = {
            "summary": resolved.summary,
            "derived": resolved.derived,
            "preset": resolved.preset,
            "reasons": [{"key": r.key, "value": r.value, "reason": r.reason} for r in resolved.reasons],
            "plan": plan_to_dict(plan, row),
            # the whole resolved configuration (what a launch would run), not only the derived keys
            "config": cfg.model_dump(mode="json"),
            "baseline": BASELINE,
        }
        print(json.dumps(out, indent=2, default=str))
    else:
        _print_plan(resolved, plan, row)
    return ExitCode.DONE if plan.memory.fits else ExitCode.FAILED


def _comparison(args: argparse.Namespace) -> ExitCode:
    listing = list_presets()
    presets = [p for p in listing.presets if p.config.topology.device == "cuda"]
    if args.overrides:
        # --set holds for every preset compared: `plan --set model.family=NAME` is that family's
        # figures on each preset, its clip fitted to the family where the preset's does not fit
        presets = [load_preset(p.name, overrides=args.overrides) for p in presets]
    fitted = {p.name: p.fitted_text for p in presets if p.fitted}
    plans = []
    for preset in presets:
        kwargs = _plan_kwargs(args, args.bandwidth or preset.meta.network or None)
        plans.append(make_plan(preset.config, name=preset.name, gpu=preset.meta.gpu, **kwargs))
    plans.sort(key=lambda pl: (pl.config.topology.world_size, pl.name))
    baseline = next(pl for pl in plans if pl.name == BASELINE)
    rows = compare_plans(plans, baseline)
    if args.json:
        out = [{**plan_to_dict(r.plan, r), "clip_fitted": fitted.get(r.plan.name, "")} for r in rows]
        print(json.dumps({"baseline": BASELINE, "plans": out}, indent=2))
        return ExitCode.DONE
    table = Table(
        title=f"Time and cost to max steps, against {BASELINE}",
        title_justify="left",
        caption="step = compute + communication (no overlap); assumptions below",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 0, 0, 1),  # left only: 12 columns fit an 80-column terminal
        pad_edge=False,
    )
    cols = ["preset", "nodes", "batch", "ZeRO", "comm", "step", "to max", "GPU-h", "speed", "cost"]
    if args.price is not None:
        cols.append("price")
    cols.append("GB")
    for col in cols:
        table.add_column(col, justify="left" if col == "preset" else "right", no_wrap=True)
    for r in rows:
        p = r.plan
        t = p.config.topology
        cells = [
            p.name,
            f"{t.nodes}x{t.gpus_per_node}",
            str(p.config.effective_batch),
            str(p.config.deepspeed.zero_stage),
            f"{p.comm.fraction:.1%}",
            f"{p.time.step_s:.1f}s",
            _hours(p.time.hours_to_max_steps),
            f"{p.time.gpu_hours:,.0f}",
            f"{r.speedup:.2f}x" if r.speedup < 1 else f"{r.speedup:.1f}x",
            f"{r.relative_cost:.2f}x",
        ]
        if args.price is not None:
            cells.append(f"{p.time.cost:,.0f}")
        cells.append(f"{p.memory.per_gpu_gb:.0f}/{p.memory.gpu_gb:g}" + ("" if p.memory.fits else " !"))
        table.add_row(*cells)
    console = _console()
    console.print(table)
    # the author's recipe on each preset (--set loss.teacher=DIR): the teacher online against cached latents
    recipe = "; ".join(
        f"{p.name} {p.teacher.online_gpu_hours:,.0f} / {p.teacher.cached_gpu_hours:,.0f}"
        for p in plans
        if p.teacher is not None
    )
    console.print(
        f"distilling (--set loss.teacher=DIR), GPU-hours with the teacher online / cached: {recipe}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    _print_checkpoint_table(console, plans)
    _print_shared_lines(console, "clip", [(p.name, (fitted[p.name],)) for p in plans if p.name in fitted])
    _print_shared_lines(console, "deepspeed", [(p.name, p.deepspeed) for p in plans])
    _print_shared_lines(console, "assumption", [(p.name, p.assumptions) for p in plans])
    _print_shared_lines(console, "note", [(p.name, p.memory.notes) for p in plans])
    return ExitCode.DONE


def _short(seconds: float) -> str:
    """A duration in a table cell: '11s', '69m', '2.2h', '4.6d'."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _print_checkpoint_table(console: Console, plans: list[Plan]) -> None:
    """What a failure costs at each preset's checkpoint interval, and the interval Young/Daly gives."""
    rows = [(p.name, p.checkpoint) for p in plans if p.checkpoint is not None]
    if not rows:
        return
    table = Table(
        title="Checkpoints and failures",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 0, 0, 1),
        pad_edge=False,
    )
    for col in ("preset", "every", "save", "MTBF", "per fail", "GPU-h lost", "Young/Daly", "gain"):
        table.add_column(col, justify="left" if col == "preset" else "right", no_wrap=True)
    for name, c in rows:
        table.add_row(
            name,
            f"{c.every_steps:,} {_short(c.interval_s)}",
            _short(c.save_s),
            f"{c.mtbf_s / 3600:,.0f}h",
            _short(c.loss_per_failure_s),
            f"{c.gpu_hours(c.expected_loss_s):.1f}+{c.gpu_hours(c.save_overhead_s):.1f}",
            f"{c.recommended_steps:,} {_short(c.recommended_interval_s)}",
            f"{c.gpu_hours(c.saved_s):,.1f}",
        )
    console.print(table)
    first = rows[0][1]
    sizes = sorted({round(c.bytes / 1e6) for _, c in rows})
    size = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,}-{sizes[-1]:,}"
    if first.failure_rate_source == LLAMA3_SOURCE:
        origin = f"from {LLAMA3_SOURCE}"
    else:
        origin = f"given; Meta's Llama 3 report gives {LLAMA3_FAILURES_PER_GPU_HOUR:.3g}"
    for line in (
        (
            f"checkpoints: failure rate {first.failures_per_gpu_hour:.3g} interruptions per GPU-hour ({origin}); "
            "MTBF = 1 / (rate x GPUs)"
        ),
        (
            f"checkpoints: per fail = half an interval + {format_duration(RESTART_S)} restart; GPU-h lost: "
            "expected over the run to failures + to the saves themselves; gain: GPU-hours Young/Daly's interval "
            "would save against the preset's"
        ),
        (
            f"checkpoints: a save (an estimate) is {size} MB written and read back at "
            f"{first.storage_bytes_per_s / GB:g} GB/s + {CHECKPOINT_FIXED_S:g} s; "
            "Young/Daly interval = sqrt(2 x save x MTBF), rounded to steps"
        ),
    ):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def _print_shared_lines(console: Console, label: str, per_plan: list[tuple[str, tuple[str, ...]]]) -> None:
    """Each distinct line once, with the presets it applies to (all of them: no list)."""
    owners: dict[str, list[str]] = {}
    for name, lines in per_plan:
        for line in lines:
            owners.setdefault(line, []).append(name)
    for line, names in owners.items():
        where = "" if len(names) == len(per_plan) else f" [{', '.join(names)}]"
        console.print(f"{label}{where}: {line}", highlight=False, markup=False)


def _console() -> Console:
    # piped or logged output is read in files and CI logs, not an 80-column window: keep it whole
    return Console() if sys.stdout.isatty() else Console(width=120)


def _meta(name_or_path: str | None) -> PresetMeta | None:
    """The [preset] table (GPU model, advised network) of a preset, when it can be read."""
    if not name_or_path or name_or_path == "auto":
        return None
    try:
        return load_preset(name_or_path).meta
    except ConfigError:
        return None


def _hours(h: float) -> str:
    return f"{h:.1f}h" if h < 48 else f"{h / 24:.1f}d"


def _print_plan(resolved: ResolvedConfig, plan: Plan, row: ComparisonRow) -> None:
    console = _console()
    c = plan.config
    t = c.topology
    console.print(f"[bold]{plan.name}[/bold]: {resolved.summary}", highlight=False)
    if resolved.reasons:
        table = Table(title="values and why", title_justify="left")
        table.add_column("key", no_wrap=True)
        table.add_column("value", max_width=28, overflow="fold")
        table.add_column("reason", ratio=1)
        for r in resolved.reasons:
            value = (
                r.value
                if not isinstance(r.value, dict)
                else ", ".join(f"{k}={v}" for k, v in r.value.items())
            )
            table.add_row(r.key, str(value), r.reason)
        console.print(table)

    comm = plan.comm
    ms = model_summary(c)
    lines = [
        (
            f"model         {ms['family']} ({ms['serves']}): {ms['parameters'] / 1e6:.2f}M parameters, "
            f"{ms['tflop_per_clip_step']:.3g} TFLOP per {'x'.join(map(str, ms['clip']))} clip-step"
        ),
        f"topology      {t.nodes} node(s) x {t.gpus_per_node} = {t.world_size} {'GPUs' if t.device == 'cuda' else 'CPU processes'}",
        (
            f"batch         {c.optim.batch_per_gpu} per GPU x {c.optim.grad_accum} accumulation x {t.world_size}"
            f" = {c.effective_batch} clips per step, LR {c.optim.lr:g}, ZeRO-{c.deepspeed.zero_stage}"
        ),
        (
            f"communication {comm.bytes_per_step / 1e6:,.1f} MB per GPU per step over {comm.link}:"
            f" {comm.seconds_per_step:.3f} s = {comm.fraction:.1%} of a step"
        ),
    ]
    if comm.smallest_accum_under_target is None:
        lines.append(
            f"              no accumulation brings it under {comm.target_fraction:.0%} at ZeRO-{c.deepspeed.zero_stage}"
            " (gradients are reduced every micro-step)"
        )
    else:
        lines.append(
            f"              smallest accumulation under {comm.target_fraction:.0%}: {comm.smallest_accum_under_target}"
        )
    tm = plan.time
    lines += [
        f"time          {tm.clips_per_s_per_gpu:.2f} clips/s per GPU; {tm.step_s:.2f} s per step; {tm.clips_per_s:,.0f} clips/s",
        f"              {c.optim.max_steps:,} steps: {_hours(tm.hours_to_max_steps)}, {tm.gpu_hours:,.0f} GPU-hours"
        + (f", cost {tm.cost:,.0f}" if tm.cost is not None else ""),
        f"              vs {BASELINE}: {row.speedup:.2f}x the speed, {row.relative_cost:.2f}x the GPU-hours",
    ]
    m = plan.memory
    breakdown = ", ".join(f"{k} {v:.2f}" for k, v in m.breakdown.items())
    lines += [
        (
            f"memory        ~{m.per_gpu_gb:.1f} of {m.gpu_gb:g} GB per {'GPU' if t.device == 'cuda' else 'process'}:"
            f" {'fits' if m.fits else 'DOES NOT FIT'} (at most {m.max_batch_per_gpu} clips per GPU)"
        ),
        f"              {breakdown} (GB)",
        f"timeout       {plan.collective_timeout}",
    ]
    lines += [f"{'deepspeed' if i == 0 else '':<14}{line}" for i, line in enumerate(plan.deepspeed)]
    if plan.teacher is not None:
        lines += [
            f"{'recipe' if i == 0 else '':<14}{line}"
            for i, line in enumerate(teacher_lines(plan.teacher, _hours))
        ]
    if plan.checkpoint is not None:
        unit = "GPU" if t.device == "cuda" else "process"
        lines += [
            f"{'checkpoints' if i == 0 else '':<14}{line}"
            for i, line in enumerate(checkpoint_lines(plan.checkpoint, unit))
        ]
    lines += [
        f"{'recovery' if i == 0 else '':<14}{line}"
        for i, line in enumerate(policy_lines(c.recovery, c.notify, plan.time.step_s))
    ]
    for line in lines:
        console.print(line, highlight=False)
    for n in m.notes:
        console.print(f"note: {n}", highlight=False, style=None if m.fits else "bold red")
    console.print("assumptions:")
    for a in plan.assumptions:
        console.print(f"  - {a}", highlight=False)
