"""Training clips/s and MFU per GPU: TAEHV steps at the full clip (12x480x720) and at the author's
crop recipe (12x64x64), bf16, fed by synthetic tensors already on the device or by the trainer's
own loader reading a directory of clips; and the author's distillation recipe with HunyuanVideo's VAE
run online every step against latents cached once (what `taehv-train cache-latents` buys).

    python benchmarks/gpu_throughput.py                              # synthetic, both recipes
    python benchmarks/gpu_throughput.py --modes synthetic,loader --data DIR --workers 8
    python benchmarks/gpu_throughput.py --modes teacher-online,teacher-cached [--teacher VAE_DIR]
    python benchmarks/gpu_throughput.py --device cpu --tiny          # CI smoke: untimed, tiny clips

MFU counts 6.1 TFLOP per 12x480x720 clip-step (FACTS: forward 2.04 TFLOP, backward twice that),
scaled by pixels x frames, against the H100's dense bf16 peak of 989 TFLOP/s. It counts the
student's FLOPs only: an online teacher (~29.9 TFLOP per 12x480x720 encode) shows as fewer clips/s.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.model import TAEHV, reconstruction_target

FLOP_PER_CLIP_STEP = 6.1e12  # one training step of one 12x480x720 clip
REFERENCE_VOXELS = 12 * 480 * 720
H100_BF16_PEAK = 989e12

# name: (frames, height, width)
RECIPES = {"full": (12, 480, 720), "crop": (12, 64, 64)}
TINY = {"full": (4, 32, 48), "crop": (4, 16, 16)}


def flop_per_clip_step(frames: int, height: int, width: int) -> float:
    return FLOP_PER_CLIP_STEP * frames * height * width / REFERENCE_VOXELS


@dataclass
class Setting:
    recipe: str
    frames: int
    height: int
    width: int
    batch: int


@dataclass
class Result:
    mode: str
    setting: Setting
    clips_per_s: float
    step_s: float
    data_wait_s: float  # per step, time the step waited for its batch


# ---------------------------------------------------------------- where batches come from
# A mode is a function giving an endless iterator of batches for a Setting (uint8 N×T×3×H×W, or
# (clip, teacher latents) for the cached recipe), with its step function registered in STEPS.


def synthetic_batches(s: Setting, args) -> Iterator[torch.Tensor]:
    """Random uint8 clips already on the device: the model's own ceiling, no data path."""
    g = torch.Generator(device="cpu").manual_seed(0)
    clip = torch.randint(0, 256, (s.batch, s.frames, 3, s.height, s.width), dtype=torch.uint8, generator=g)
    clip = clip.to(args.device)
    while True:
        yield clip


def loader_batches(s: Setting, args) -> Iterator[torch.Tensor]:
    """The trainer's own dataset and loader over --data, with --workers processes."""
    from trainer.config import DataSection
    from trainer.data import VideoClipDataset, find_videos, make_train_loader

    if not args.data:
        raise SystemExit("--modes loader needs --data DIR (a directory of clips)")
    cfg = DataSection(
        source=str(args.data),
        frames=s.frames,
        height=s.height,
        width=s.width,
        num_workers=args.workers,
        max_delta=1,
    )
    dataset = VideoClipDataset(find_videos(cfg.source), cfg, train=True)
    loader = make_train_loader(dataset, 0, 1, 0, s.batch, 0, cfg.num_workers, cfg.prefetch_factor)
    while True:
        for batch in loader:
            yield batch["video"].to(args.device, non_blocking=True)


_TEACHER: dict[str, torch.nn.Module] = {}


def teacher(args) -> torch.nn.Module:
    """HunyuanVideo's VAE from --teacher, or its architecture with random weights (the cost is the
    real one; weights do not matter for timing); --tiny takes a tiny one so CI's smoke run is cheap."""
    if "vae" not in _TEACHER:
        from diffusers import AutoencoderKLHunyuanVideo

        if args.teacher:
            vae = AutoencoderKLHunyuanVideo.from_pretrained(args.teacher)
        elif args.tiny:
            vae = AutoencoderKLHunyuanVideo(
                block_out_channels=(8, 8, 16, 16),
                layers_per_block=1,
                norm_num_groups=4,
                mid_block_add_attention=False,
            )
        else:
            vae = AutoencoderKLHunyuanVideo()
        dtype = torch.bfloat16 if args.bf16 else torch.float32
        _TEACHER["vae"] = vae.requires_grad_(False).eval().to(args.device, dtype)
    return _TEACHER["vae"]


def cached_batches(s: Setting, args) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Synthetic clips with their teacher latents computed once, outside the timed steps: training
    from `taehv-train cache-latents`' output reads latents and never runs the teacher."""
    from trainer.teacher import encode

    clip = next(synthetic_batches(s, args))
    latents = encode(teacher(args), clip.float().div(255)).float()
    while True:
        yield clip, latents


MODES: dict[str, Callable[[Setting, object], Iterator]] = {
    "synthetic": synthetic_batches,
    "loader": loader_batches,
    "teacher-online": synthetic_batches,
    "teacher-cached": cached_batches,
}


# ---------------------------------------------------------------- the measured step
def build(args) -> tuple[TAEHV, torch.optim.Optimizer]:
    model = TAEHV().to(args.device)
    if args.channels_last:
        model.use_channels_last()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), fused=args.device == "cuda")
    if args.compile:
        model.compile()
    return model, opt


def reconstruction_step(model: TAEHV, opt, video_u8: torch.Tensor, args) -> None:
    """What the trainer does per micro-batch without a teacher: uint8 -> [0, 1] on the device,
    bf16 forward, MSE of the unclamped output, backward, AdamW on fp32 weights."""
    x = video_u8.float().div_(255)
    with torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.bf16):
        _z, y = model(x, clamp=False)
    loss = F.mse_loss(y.float(), reconstruction_target(x, y.shape[1]))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def distill_step(model: TAEHV, opt, batch, args) -> None:
    """The author's recipe per micro-batch: encoder MSE to the teacher's latents, decoder run on
    them with MSE to the frames. Online, the teacher encodes every batch (bf16, no grad)."""
    from trainer.teacher import encode

    video_u8, latents = batch if isinstance(batch, tuple) else (batch, None)
    x = video_u8.float().div_(255)
    if latents is None:
        latents = encode(teacher(args), x).float()
    with torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.bf16):
        z = model.encode(x)
        y = model.decode(latents, clamp=False)
    loss = F.mse_loss(z.float(), latents) + F.mse_loss(y.float(), reconstruction_target(x, y.shape[1]))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


STEPS = {
    "synthetic": reconstruction_step,
    "loader": reconstruction_step,
    "teacher-online": distill_step,
    "teacher-cached": distill_step,
}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(mode: str, s: Setting, args) -> Result:
    torch.manual_seed(0)
    model, opt = build(args)
    step = STEPS[mode]
    batches = MODES[mode](s, args)
    for _ in range(args.warmup):
        step(model, opt, next(batches), args)
    sync(args.device)
    wait = 0.0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        tw = time.perf_counter()
        video = next(batches)
        wait += time.perf_counter() - tw
        step(model, opt, video, args)
    sync(args.device)
    elapsed = time.perf_counter() - t0
    return Result(mode, s, s.batch * args.steps / elapsed, elapsed / args.steps, wait / args.steps)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="synthetic", help=f"comma-separated, of: {', '.join(MODES)}")
    p.add_argument("--recipes", default="full,crop", help=f"comma-separated, of: {', '.join(RECIPES)}")
    p.add_argument("--batch-full", type=int, default=4, help="clips per step at the full size")
    p.add_argument("--batch-crop", type=int, default=64, help="clips per step at the crop size")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--data", type=Path, help="a directory of clips, for --modes loader")
    p.add_argument("--workers", type=int, default=8, help="loader processes, for --modes loader")
    p.add_argument(
        "--teacher",
        type=Path,
        help="a diffusers AutoencoderKLHunyuanVideo directory, for the teacher "
        "modes (default: its architecture with random weights, which costs the same)",
    )
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--no-bf16", dest="bf16", action="store_false")
    p.add_argument("--channels-last", action="store_true", default=True)
    p.add_argument("--no-channels-last", dest="channels_last", action="store_false")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--tiny", action="store_true", help="tiny clips, batch 1, 2 steps: a smoke run, untimed")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here; use --device cpu --tiny for the smoke run")
    if args.device == "cuda":
        torch.backends.cudnn.benchmark = True
    unknown = set(args.modes.split(",")) - set(MODES) or set(args.recipes.split(",")) - set(RECIPES)
    if unknown:
        raise SystemExit(f"unknown mode or recipe: {', '.join(sorted(unknown))}")
    if args.tiny:
        args.steps, args.warmup = 2, 1
    sizes = TINY if args.tiny else RECIPES
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(
        f"# {name}, {'bf16' if args.bf16 else 'fp32'}, channels_last {args.channels_last}, "
        f"compile {args.compile}, {args.steps} timed steps after {args.warmup}"
        + (" (tiny smoke run: figures are not a measurement)" if args.tiny else "")
    )
    print(
        f"{'mode':<10} {'recipe':<6} {'clip':>10} {'batch':>5} {'clips/s':>9} {'step s':>8} "
        f"{'wait s':>7} {'TFLOP/s':>8} {'MFU':>6}"
    )
    for mode in args.modes.split(","):
        for recipe in args.recipes.split(","):
            frames, h, w = sizes[recipe]
            batch = 1 if args.tiny else (args.batch_full if recipe == "full" else args.batch_crop)
            r = measure(mode, Setting(recipe, frames, h, w, batch), args)
            tflops = r.clips_per_s * flop_per_clip_step(frames, h, w)
            print(
                f"{mode:<10} {recipe:<6} {f'{frames}x{h}x{w}':>10} {batch:>5} {r.clips_per_s:9.2f} "
                f"{r.step_s:8.4f} {r.data_wait_s:7.4f} {tflops / 1e12:8.1f} {tflops / H100_BF16_PEAK:6.1%}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
