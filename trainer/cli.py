"""`taehv-train`: the command every node runs (through `accelerate launch`), clip generation, and the
data-path benchmark."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

from trainer.hard_exit import exit_now


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taehv-train", description="Train TAEHV on one rank of a run.")
    parser.add_argument("--run", type=Path, help="the run directory holding run.toml")
    parser.add_argument(
        "--resume", metavar="latest|PATH", help="resume from the newest complete checkpoint or a path"
    )
    parser.add_argument(
        "--weights-only",
        action="store_true",
        help="with --resume: load the checkpoint's weights with a fresh optimizer (e.g. at another world size)",
    )
    sub = parser.add_subparsers(dest="command")
    syn = sub.add_parser("make-synthetic", help="write synthetic video clips for demos and tests")
    syn.add_argument("dir", type=Path)
    syn.add_argument("--clips", type=int, default=8)
    syn.add_argument("--frames", type=int, default=16)
    syn.add_argument("--size", default="64x64", help="HxW, e.g. 480x720 (height x width)")
    syn.add_argument("--fps", type=int, default=24)
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument(
        "--photos", action="store_true", help="a camera moving over real photographs (needs scikit-image)"
    )
    cache = sub.add_parser(
        "cache-latents",
        help="run the teacher VAE once over the data and write its latents (resumable; spread over the "
        "processes of a launch by RANK/WORLD_SIZE)",
    )
    cache.add_argument(
        "--run", dest="cache_run", type=Path, required=True, help="the run directory holding run.toml"
    )
    cache.add_argument("--out", help="cache directory (default: loss.teacher_cache of run.toml)")
    cache.add_argument(
        "--size",
        help="canvas HxW the latents cover (default: data.height x data.width); "
        "training takes latent-aligned crops of data.height x data.width from it",
    )
    cache.add_argument("--max-windows", type=int, default=4, help="frame windows cached per clip (default 4)")
    bench = sub.add_parser(
        "bench-data",
        help="measure the data path: CPU-s per training clip and the loader workers a GPU needs",
    )
    bench.add_argument("dir", help="a folder of videos or an annotation JSON (as data.source)")
    bench.add_argument(
        "--config", type=Path, help="take the data settings from this run.toml (the options below override)"
    )
    bench.add_argument("--frames", type=int, help="frames per clip (default: the config's, else 12)")
    bench.add_argument("--size", help="crop HxW, e.g. 480x720 (default: the config's, else 480x720)")
    bench.add_argument(
        "--frame-height", type=int, help="data.frame_height: frames scaled to this before cropping"
    )
    bench.add_argument(
        "--crops-per-clip", type=int, help="data.crops_per_clip: training crops cut from each decoded clip"
    )
    bench.add_argument("--clips", type=int, default=16, help="clips to decode (after one warm-up clip)")
    bench.add_argument("--workers", type=int, help="say whether this many loader workers per GPU keep up")
    bench.add_argument(
        "--target-clips-per-s",
        type=float,
        help="clips/s one GPU consumes (the console passes its planner's figure; default: an H100 at 40%% "
        "MFU, 65 clips/s at 12x480x720, scaled by the clip size)",
    )
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def _bench_data(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:

    from trainer.bench_data import default_target_clips_per_s, measure_loader, report_lines
    from trainer.config import ConfigError, DataSection, TrainConfig, load_config
    from trainer.data import DataSourceError, find_videos
    from trainer.synthetic import parse_size

    try:
        cfg = load_config(args.config) if args.config else TrainConfig()
        data = cfg.data
    except ConfigError as err:
        parser.error(str(err))
    changes: dict = {"source": args.dir} if not args.config else {"source": args.dir, "root": data.root}
    if args.frames is not None:
        changes["frames"] = args.frames
    if args.size is not None:
        try:
            changes["height"], changes["width"] = parse_size(args.size)
        except ValueError as err:
            parser.error(str(err))
    if args.frame_height is not None:
        changes["frame_height"] = args.frame_height
    if args.crops_per_clip is not None:
        changes["crops_per_clip"] = args.crops_per_clip
    try:
        # checked against the family's clip rule (model.family; taehv without --config), as a run is
        data = DataSection.model_validate(
            {**data.model_dump(), **changes}, context={"clip_rule": cfg.clip_rule}
        )
    except ValueError as err:
        parser.error(f"bench-data settings: {err}")
    if args.clips < 1:
        parser.error("--clips must be at least 1")
    if args.target_clips_per_s is not None:
        target, why = args.target_clips_per_s, "given"
    else:
        target = default_target_clips_per_s(data.frames, data.height, data.width)
        why = "H100 at 40% MFU"
    try:
        cost = measure_loader(find_videos(data.source, data.root), data, args.clips, seed=args.seed)
    except DataSourceError as err:
        print(f"taehv-train bench-data: {err}", file=sys.stderr)
        return 2
    workers = args.workers if args.workers is not None else (data.num_workers if args.config else None)
    if args.json:
        need = cost.workers_for(target)
        print(json.dumps({**cost.to_dict(), "target_clips_per_s": target, "workers_needed": need}))
    else:
        print("\n".join(report_lines(cost, target, why, workers)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "make-synthetic":
        from trainer.synthetic import make_photo_clips, make_synthetic, parse_size

        try:
            height, width = parse_size(args.size)
        except ValueError as err:
            parser.error(str(err))
        if args.clips < 1 or args.frames < 1:
            parser.error("--clips and --frames must be at least 1")
        make = make_photo_clips if args.photos else make_synthetic
        try:
            paths = make(args.dir, args.clips, args.frames, height, width, fps=args.fps, seed=args.seed)
        except (ValueError, RuntimeError) as err:
            parser.error(str(err))
        print(f"wrote {len(paths)} clips of {args.frames} frames at {height}x{width} to {args.dir}")
        return 0
    if args.command == "cache-latents":
        from trainer.latent_cache import cache_main

        if args.max_windows < 1:
            parser.error("--max-windows must be at least 1")
        return cache_main(args.cache_run, args.out, args.size, args.max_windows)
    if args.command == "bench-data":
        return _bench_data(parser, args)
    if args.run is None:
        parser.error("--run RUN_DIR is required (or use the make-synthetic or bench-data command)")
    if args.weights_only and not args.resume:
        parser.error("--weights-only needs --resume")
    from trainer.train import run

    return run(args.run, resume=args.resume, weights_only=args.weights_only)


def entry() -> NoReturn:
    """The process entry (`taehv-train`, and `python -m trainer.cli`, which every launched rank runs):
    `main`, then out without interpreter finalisation, which races gloo's worker threads (see
    trainer.hard_exit). `main` itself returns, for callers in-process."""
    exit_now(main())


if __name__ == "__main__":
    entry()
