"""Validation PSNR every 10 steps for the old init (PyTorch defaults, clamped loss) and the new one
(Kaiming fan-in, zeroed MemBlock tails, unclamped loss), on generated clips and on photo clips.

One process, plain PyTorch (no DeepSpeed): the init and the loss are what is compared, so
everything else (data, batches, seeds, optimizer) is identical between the two.

    python benchmarks/init_psnr.py                       # FACTS' setting: batch 4 of 8x64x96, LR 5e-4
    python benchmarks/init_psnr.py --device cuda --steps 200
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.metrics import psnr_from_mse
from trainer.model import TAEHV, reconstruction_target
from trainer.synthetic import make_photo_clips, make_synthetic


def old_init(model: TAEHV) -> TAEHV:
    """What the trainer shipped before: every conv at PyTorch's default init, output bias 0.5."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            m.reset_parameters()
    nn.init.constant_(model.decoder[-1].bias, 0.5)
    return model


INITS = {
    # name: (how the model is initialised, whether the training loss sees the clamped output)
    "old": (old_init, True),
    "new": (lambda m: m, False),
}


def decode_clip(path: Path) -> torch.Tensor:
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()  # T×3×H×W uint8


def make_clips(kind: str, out: Path, n: int, frames: int, h: int, w: int) -> list[torch.Tensor]:
    make = make_photo_clips if kind == "photos" else make_synthetic
    # sources 1.5x the training size, so training takes random crops as the trainer does
    paths = make(out / kind, n, frames * 2, h * 3 // 2 // 2 * 2, w * 3 // 2 // 2 * 2, seed=11)
    return [decode_clip(p) for p in paths]


def sample(
    clips: list[torch.Tensor], n: int, frames: int, h: int, w: int, g: torch.Generator
) -> torch.Tensor:
    out = []
    for _ in range(n):
        c = clips[int(torch.randint(len(clips), (1,), generator=g))]
        t0 = int(torch.randint(c.shape[0] - frames + 1, (1,), generator=g))
        y0 = int(torch.randint(c.shape[2] - h + 1, (1,), generator=g))
        x0 = int(torch.randint(c.shape[3] - w + 1, (1,), generator=g))
        out.append(c[t0 : t0 + frames, :, y0 : y0 + h, x0 : x0 + w])
    return torch.stack(out)


def val_set(clips: list[torch.Tensor], frames: int, h: int, w: int) -> torch.Tensor:
    """The first frames of each validation clip, centre crop: fixed, so every curve sees the same."""
    out = []
    for c in clips:
        y0, x0 = (c.shape[2] - h) // 2, (c.shape[3] - w) // 2
        out.append(c[:frames, :, y0 : y0 + h, x0 : x0 + w])
    return torch.stack(out)


@torch.no_grad()
def validate(model: TAEHV, val: torch.Tensor, device: str) -> float:
    model.eval()
    psnrs = []
    for v in val:
        x = v[None].to(device).float() / 255
        _z, y = model(x)
        psnrs.append(psnr_from_mse(F.mse_loss(y, reconstruction_target(x, y.shape[1])).item()))
    model.train()
    return sum(psnrs) / len(psnrs)


def curve(init: str, train: list[torch.Tensor], val: torch.Tensor, args) -> list[tuple[int, float]]:
    torch.manual_seed(args.seed)
    setup, clamp_loss = INITS[init]
    model = setup(TAEHV()).to(args.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=1e-2)
    g = torch.Generator().manual_seed(args.seed)
    h, w = args.size
    points = [(0, validate(model, val, args.device))]
    for step in range(1, args.steps + 1):
        for group in opt.param_groups:
            group["lr"] = args.lr * min(1.0, step / args.warmup) if args.warmup else args.lr
        x = sample(train, args.batch, args.frames, h, w, g).to(args.device).float() / 255
        _z, y = model(x, clamp=clamp_loss)
        loss = F.mse_loss(y, reconstruction_target(x, y.shape[1]))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % args.every == 0:
            points.append((step, validate(model, val, args.device)))
            print(f"# {init} step {step}: {points[-1][1]:.2f} dB", file=sys.stderr, flush=True)
    return points


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--size", default="64x96", help="HxW of training and validation crops")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--clips", type=int, default=12, help="clips per data kind; a quarter are validation")
    p.add_argument("--data", default="generated,photos")
    p.add_argument("--inits", default="old,new")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    args.size = tuple(int(v) for v in args.size.lower().split("x"))
    h, w = args.size
    print(
        f"# batch {args.batch} of {args.frames}x{h}x{w}, LR {args.lr:g}, warmup {args.warmup}, "
        f"{args.steps} steps, device {args.device}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.data.split(","):
            clips = make_clips(kind, Path(tmp), args.clips, args.frames, h, w)
            n_val = max(1, len(clips) // 4)
            val = val_set(clips[:n_val], args.frames, h, w)
            curves = {}
            for init in args.inits.split(","):
                t0 = time.time()
                curves[init] = curve(init, clips[n_val:], val, args)
                print(f"# {kind} {init}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
            names = list(curves)
            print(f"\n{kind}: validation PSNR (dB)")
            print("step  " + "  ".join(f"{n:>7}" for n in names))
            for i, (step, _) in enumerate(curves[names[0]]):
                print(f"{step:>4}  " + "  ".join(f"{curves[n][i][1]:7.2f}" for n in names), flush=True)


if __name__ == "__main__":
    main()
