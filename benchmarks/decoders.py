"""PyAV (the trainer's decoder) against torchcodec: CPU-s and wall-s per training clip's frames, and
whether both return the same pixels, on H.264 photo clips (a camera moving over photographs).

    .venv/bin/python benchmarks/decoders.py [DIR ...] [--keep OUT] [--clips 24] [--frames 12] [--step 1]

Without a DIR it writes photo clips first (into OUT with --keep, else a temporary folder): 854x480
short (60 frames), 854x480 long (240 frames, a keyframe every 48, and x264's default 250) and
1920x1080 (60 frames). Each clip's frames are `--frames` frames `--step` apart from a random start,
read the trainer's way (`trainer.data.read_frames`: seek to the keyframe before, decode on) and with
`torchcodec.decoders.VideoDecoder(...).get_frames_at` in its exact and approximate seek modes, all
with the trainer's decoder thread count. The decoders take turns clip by clip, so other load on the
machine falls on all alike. CPU-s is this process's CPU time (all its threads).

torchcodec is not a dependency: where it does not import, the PyAV figures are printed and the
reason is said. Where CUDA is available, torchcodec's NVDEC decoding (device="cuda") is measured
too: its CPU-s and wall-s per clip, the output left on the GPU.

NVDEC through PyAV itself (`pyav-nvdec`): the trainer's read with `hwaccel=HWAccel("cuda")`, which
PyAV's own FFmpeg supports (its wheels bundle the cuda hwaccel and nv-codec headers), so it runs
on a GPU machine with nothing but the wheel: no system FFmpeg, no torch. Frames come back to host
memory as the trainer's read returns them; its pixels are compared with the CPU decode's. Each
read opens the file anew, as the loader does, on the device's primary CUDA context. Where
there is no NVDEC, the reason is said. Generated sets are photo clips where scikit-image and SciPy
import, else the analytic clips (`trainer.synthetic.make_synthetic`), which need only NumPy.
`--sets` picks generated sets by name (the GPU session reads only the 1080p one).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.data import _DECODE_THREADS, _count_frames, find_videos, read_frames
from trainer.synthetic import make_photo_clips, make_synthetic

# (folder, frames, height, width, keyframe interval or None for x264's default)
_SETS = (
    ("854x480-60f", 60, 480, 854, None),
    ("854x480-240f-gop48", 240, 480, 854, 48),
    ("854x480-240f-gop250", 240, 480, 854, None),
    ("1920x1080-60f", 60, 1080, 1920, None),
)


def _write_sets(root: Path, clips: int, names: list[str] | None) -> list[Path]:
    unknown = sorted(set(names or ()) - {s[0] for s in _SETS})
    if unknown:
        raise SystemExit(f"--sets: no set {', '.join(unknown)} (sets: {', '.join(s[0] for s in _SETS)})")
    try:
        import scipy.ndimage  # noqa: F401
        import skimage.data  # noqa: F401

        make = make_photo_clips
    except ImportError as err:
        print(f"photo clips need scikit-image and SciPy ({err}): analytic clips instead")
        make = make_synthetic
    folders = []
    for name, frames, height, width, gop in _SETS:
        if names is None or name in names:
            make(root / name, clips, frames, height, width, seed=7, gop=gop)
            folders.append(root / name)
    return folders


def _nvdec(path: Path, frames: int):
    """PyAV's NVDEC, as an HWAccel the trainer's read takes, if one clip decodes with it here."""
    try:
        from av.codec.hwaccel import HWAccel, hwdevices_available
    except ImportError as err:  # PyAV before 14
        return None, f"this PyAV has no hwaccel ({err})"
    if "cuda" not in hwdevices_available():
        return None, f"this PyAV's FFmpeg has no cuda hwaccel (it has: {', '.join(hwdevices_available())})"
    # the device's primary CUDA context (torch's too): each open would otherwise create a context
    hwaccel = HWAccel("cuda", options={"primary_ctx": "1"})
    try:
        read_frames(path, list(range(frames)), hwaccel=hwaccel)
    except (av.FFmpegError, OSError) as err:  # no CUDA driver or device, no NVDEC for this codec
        return None, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return hwaccel, ""


def _torchcodec():
    try:
        from torchcodec.decoders import VideoDecoder
    except (ImportError, OSError, RuntimeError) as err:  # or a wheel whose native libraries fail to load
        return None, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return VideoDecoder, ""


def _timed(fn, *args, **kwargs):
    c0, w0 = time.process_time(), time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.process_time() - c0, time.perf_counter() - w0


def _torchcodec_frames(decoder, path: Path, indices: list[int], device: str, seek_mode: str):
    d = decoder(
        str(path),
        device=device,
        dimension_order="NHWC",
        seek_mode=seek_mode,
        num_ffmpeg_threads=_DECODE_THREADS,
    )
    out = d.get_frames_at(indices).data
    if device == "cuda":
        import torch

        torch.cuda.synchronize()
    return out


# (row name, device, seek mode) of the torchcodec rows
_TORCHCODEC_ROWS = (("torchcodec", "cpu", "exact"), ("torchcodec-approx", "cpu", "approximate"))
_CUDA_ROW = ("torchcodec-cuda", "cuda", "exact")


def _long_enough(folder: Path, frames: int, step: int) -> dict[Path, int]:
    """Frame count of each video in `folder` that holds a clip's span (counting decodes every frame:
    done once per folder)."""
    span = (frames - 1) * step + 1
    lengths = {p: _count_frames(p) for p in find_videos(str(folder))}
    lengths = {p: n for p, n in lengths.items() if n >= span}
    if not lengths:
        raise SystemExit(
            f"{folder}: no video has the {span} frames a clip of {frames} frames {step} apart spans"
        )
    return lengths


def _measure(
    lengths: dict[Path, int], n_clips: int, frames: int, step: int, decoder, cuda: bool, nvdec=None
) -> dict:
    span = (frames - 1) * step + 1
    paths = list(lengths)
    rng = np.random.default_rng(0)
    rows = (*_TORCHCODEC_ROWS, _CUDA_ROW) if cuda else _TORCHCODEC_ROWS
    cost: dict[str, list[tuple[float, float]]] = {"pyav": [], "pyav-nvdec": []}
    cost.update({name: [] for name, _, _ in rows})
    diffs: list[float] = []
    nvdec_diffs: list[float] = []
    for k in range(n_clips):
        path = paths[k % len(paths)]
        start = int(rng.integers(0, lengths[path] - span + 1))
        indices = list(range(start, start + span, step))
        ours, cpu, wall = _timed(read_frames, path, indices)
        cost["pyav"].append((cpu, wall))
        if nvdec is not None:
            theirs, cpu, wall = _timed(read_frames, path, indices, hwaccel=nvdec)
            cost["pyav-nvdec"].append((cpu, wall))
            nvdec_diffs.append(float(np.abs(theirs.astype(np.int16) - ours.astype(np.int16)).mean()))
        if decoder is None:
            continue
        for name, device, mode in rows:
            theirs, cpu, wall = _timed(_torchcodec_frames, decoder, path, indices, device, mode)
            cost[name].append((cpu, wall))
            pixels = theirs.cpu().numpy().astype(np.int16)
            diffs.append(float(np.abs(pixels - ours.astype(np.int16)).mean()))
    return {"cost": cost, "diffs": diffs, "nvdec_diffs": nvdec_diffs, "size": ours.shape}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="*", type=Path, help="folders of videos (default: generated sets)")
    parser.add_argument("--keep", type=Path, help="write the generated sets here, and keep them")
    parser.add_argument("--clips", type=int, default=24, help="clips read per decoder and set")
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument("--step", type=int, default=1, help="frame step within a clip")
    parser.add_argument("--make", type=int, default=4, help="videos generated per set (without DIR)")
    parser.add_argument(
        "--sets",
        help=f"generated sets to read, comma-separated (default all: {', '.join(s[0] for s in _SETS)})",
    )
    args = parser.parse_args()
    decoder, why = _torchcodec()
    cuda = False
    if decoder is None:
        print(f"torchcodec does not import here ({why}): PyAV only")
    else:
        import torch
        import torchcodec

        cuda = torch.cuda.is_available()
        print(
            f"torchcodec {torchcodec.__version__}, torch {torch.__version__}, CUDA {'yes' if cuda else 'no'}"
        )
    print(
        f"decoder threads {_DECODE_THREADS}, {args.frames} frames {args.step} apart per clip, {args.clips} clips each"
    )
    with tempfile.TemporaryDirectory() as tmp:
        sets = args.sets.split(",") if args.sets else None
        folders = args.dirs or _write_sets(args.keep or Path(tmp), args.make, sets)
        nvdec = None
        for folder in folders:
            # one untimed clip each first: library loading and first-open costs stay out of the figures
            lengths = _long_enough(folder, args.frames, args.step)
            if folder is folders[0]:  # NVDEC probed once, on the first set's first video
                nvdec, why = _nvdec(next(iter(lengths)), args.frames)
                print(
                    "PyAV NVDEC: " + ("yes, the pyav-nvdec row" if nvdec is not None else f"not here ({why})")
                )
            try:
                _measure(lengths, 1, args.frames, args.step, decoder, cuda, nvdec)
            except RuntimeError as err:  # e.g. a GPU or driver without NVDEC for this codec
                if not cuda:
                    raise
                print(f"torchcodec on CUDA failed ({str(err).splitlines()[0][:200]}): CPU rows only")
                cuda = False
            m = _measure(lengths, args.clips, args.frames, args.step, decoder, cuda, nvdec)
            h, w = m["size"][1:3]
            print(f"== {folder.name} ({w}x{h})")
            for name, rows in m["cost"].items():
                if rows:
                    cpu = np.median([r[0] for r in rows])
                    wall = np.median([r[1] for r in rows])
                    print(
                        f"  {name:16s} {cpu:.3f} CPU-s, {wall:.3f} wall-s per clip (median), "
                        f"{1 / cpu:.1f} clips per CPU-s"
                    )
            if m["nvdec_diffs"]:
                print(
                    f"  pixels: mean |pyav-nvdec - pyav| {np.mean(m['nvdec_diffs']):.3f} of 255 "
                    f"(largest clip mean {max(m['nvdec_diffs']):.3f})"
                )
            if m["diffs"]:
                print(
                    f"  pixels: mean |torchcodec - PyAV| {np.mean(m['diffs']):.3f} of 255 "
                    f"(largest clip mean {max(m['diffs']):.3f})"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
