"""CPU-s per training clip of the data path (decode, crop, resize in uint8; jitter counted apart, as it
runs on the GPU in training), at 12x480x720 and at the crop recipe (64x64 windows of frames scaled
to 480 high), on 480p H.264 videos. Target: <= 0.08 CPU-s per 12x480x720 clip.

    .venv/bin/python benchmarks/data_path.py [DIR] [--clips 16]

Without DIR it writes six 854x480 H.264 clips first (synthetic: textured and noisy, so they decode
slower than typical 480p video at 1-2.5 Mbit/s; a real folder gives the figure that matters).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.bench_data import default_target_clips_per_s, measure_loader, report_lines
from trainer.config import DataSection
from trainer.data import find_videos
from trainer.synthetic import make_synthetic


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path)
    parser.add_argument("--clips", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.dir
        if folder is None:
            folder = Path(tmp)
            make_synthetic(folder, clips=6, frames=60, height=480, width=854, seed=1)
        paths = find_videos(str(folder))
        for title, data in (
            ("12x480x720 clips", DataSection(source=str(folder), frames=12, height=480, width=720)),
            (
                "crop recipe: 12x64x64 windows of frames scaled to 480 high, frame step 1-5",
                DataSection(
                    source=str(folder), frames=12, height=64, width=64, frame_height=480, max_delta=5
                ),
            ),
        ):
            cost = measure_loader(paths, data, args.clips)
            target = default_target_clips_per_s(data.frames, data.height, data.width)
            print(f"== {title}")
            print("\n".join(report_lines(cost, target, "H100 at 40% MFU")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
