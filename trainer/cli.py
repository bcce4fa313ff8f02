"""`taehv-train`: the command every node runs (through `accelerate launch`), and clip generation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="taehv-train", description="Train TAEHV on one rank of a run.")
    parser.add_argument("--run", type=Path, help="the run directory holding run.toml")
    parser.add_argument("--resume", metavar="latest|PATH", help="resume from the newest complete checkpoint or a path")
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
    return parser


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
    if args.run is None:
        parser.error("--run RUN_DIR is required (or use the make-synthetic command)")
    if args.weights_only and not args.resume:
        parser.error("--weights-only needs --resume")
    from trainer.train import run

    return run(args.run, resume=args.resume, weights_only=args.weights_only)


if __name__ == "__main__":
    sys.exit(main())
