"""`taehv-console presets`: list the shipped and user presets (a table, or --json).

Nothing heavy (torch, Textual) is imported: `taehv-console --help` imports this module.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from taehv_console.commands.options import add_option
from taehv_console.core.plan.presets import Preset, list_presets, user_preset_dir
from taehv_console.exit_codes import CRASHED_MEANING, ExitCode

EXIT_CODES = {
    ExitCode.DONE: "listed",
    ExitCode.FAILED: "listed, but a user preset failed to load (named on stderr)",
    ExitCode.USAGE: "wrong command line",
    ExitCode.CRASHED: CRASHED_MEANING,
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


def register(parser: argparse.ArgumentParser) -> None:
    add_option(parser, "json", help="print the presets as JSON")


def preset_to_dict(p: Preset) -> dict:
    c = p.config
    return {
        "name": p.name,
        "source": p.source,
        "path": p.path,
        "description": p.meta.description,
        "gpu": p.meta.gpu,
        "network": p.meta.network,
        "nodes": c.topology.nodes,
        "gpus_per_node": c.topology.gpus_per_node,
        "world_size": c.topology.world_size,
        "device": c.topology.device,
        "batch_per_gpu": c.optim.batch_per_gpu,
        "grad_accum": c.optim.grad_accum,
        "effective_batch": c.effective_batch,
        "lr": c.optim.lr,
        "zero_stage": c.deepspeed.zero_stage,
        "clip": [c.data.frames, c.data.height, c.data.width],
        "max_steps": c.optim.max_steps,
    }


def run(args: argparse.Namespace) -> ExitCode:
    listing = list_presets()
    # smallest world first, CPU presets last: the order a reader compares them in
    ordered = sorted(
        listing.presets,
        key=lambda p: (p.config.topology.device != "cuda", p.config.topology.world_size, p.name),
    )
    if args.json:
        print(
            json.dumps(
                {
                    "presets": [preset_to_dict(p) for p in ordered],
                    "user_dir": str(user_preset_dir()),
                    "errors": list(listing.errors),
                },
                indent=2,
            )
        )
    else:
        table = Table(title="Presets", title_justify="left")
        for col in ("name", "topology", "GPU", "batch", "LR", "ZeRO", "clip", "description"):
            table.add_column(col, no_wrap=col != "description")
        for p in ordered:
            c = p.config
            name = p.name if p.source == "shipped" else f"{p.name} ({p.source})"
            table.add_row(
                name,
                p.topology_label,
                p.meta.gpu or "-",
                f"{c.optim.batch_per_gpu} x {c.optim.grad_accum} = {c.effective_batch}",
                f"{c.optim.lr:g}",
                str(c.deepspeed.zero_stage),
                f"{c.data.frames}x{c.data.height}x{c.data.width}",
                p.meta.description,
            )
        # piped output goes to files and logs: wide enough for the descriptions
        (Console() if sys.stdout.isatty() else Console(width=140)).print(table)
        print(f"user presets: {user_preset_dir()}")
    for err in listing.errors:
        print(f"error: {err}", file=sys.stderr)
    return ExitCode.FAILED if listing.errors else ExitCode.DONE
