"""The decoder's adversarial term, after the author's notebook: a small conditional patch
discriminator over groups of 3 decoded frames, conditioned on the time-averaged latents behind them.

Its ideas: BatchNorm/ReLU blocks, a prediction map from every block (coarse and fine patches both
vote), a replay buffer of earlier generated groups (the discriminator does not forget what the
decoder used to get wrong), and relativistic losses whose logit differences are divided by their
own spread, so the correction the decoder gets keeps one scale as the discriminator sharpens.

The discriminator is a plain module outside DeepSpeed: every rank holds all of it, and its
gradients are averaged by one all-reduce, so ZeRO-2 and ZeRO-3 treat it the same.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from trainer.optim import AdamW

if TYPE_CHECKING:
    from trainer.config import AdversarialSection

GROUP = 3  # frames per discriminator sample
WEIGHTS = "trainer/discriminator.safetensors"
OPTIMIZER = "trainer/discriminator_optim.pt"


class PatchDiscriminator(nn.Module):
    def __init__(self, latent_channels: int = 16, width: int = 32, blocks: int = 3):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3 * GROUP + latent_channels, width, 3, padding=1), nn.ReLU())
        self.blocks = nn.ModuleList()
        self.heads = nn.ModuleList([nn.Conv2d(width, 1, 1)])
        ch = width
        for _ in range(blocks):
            nxt = min(ch * 2, 8 * width)
            self.blocks.append(
                nn.Sequential(
                    nn.Conv2d(ch, nxt, 4, stride=2, padding=1, bias=False), nn.BatchNorm2d(nxt), nn.ReLU()
                )
            )
            self.heads.append(nn.Conv2d(nxt, 1, 1))
            ch = nxt

    def forward(self, frames: torch.Tensor, cond: torch.Tensor) -> list[torch.Tensor]:
        """frames B x 9 x H x W in [0, 1], cond B x C x H/8 x W/8 -> one logit map per block."""
        cond = F.interpolate(cond, size=frames.shape[-2:], mode="nearest")
        h = self.stem(torch.cat([frames.mul(2).sub(1), cond], 1))
        out = [self.heads[0](h)]
        for block, head in zip(self.blocks, self.heads[1:]):
            h = block(h)
            out.append(head(h))
        return out


def frame_groups(video: torch.Tensor, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoded frames N x T' x 3 x H x W (aligned with input frames [0, T')) and latents
    N x k x C x h x w -> (B x 9 x H x W groups of 3 consecutive frames, B x C x h x w the mean of the
    latents those frames decode from: frame t comes from latent ceil(t/4), the causal convention)."""
    t = video.shape[1]
    groups = t // GROUP
    if groups == 0:
        raise ValueError(f"{t} decoded frames: the discriminator needs at least {GROUP}")
    frames, conds = [], []
    for g in range(groups):
        ts = range(g * GROUP, (g + 1) * GROUP)
        idx = sorted({min((i + 3) // 4, latents.shape[1] - 1) for i in ts})
        frames.append(video[:, g * GROUP : (g + 1) * GROUP].flatten(1, 2))
        conds.append(latents[:, idx].mean(1))
    return torch.stack(frames, 1).flatten(0, 1), torch.stack(conds, 1).flatten(0, 1)


def _relativistic(real: list[torch.Tensor], fake: list[torch.Tensor], for_generator: bool) -> torch.Tensor:
    """Mean over blocks of softplus losses on (real - mean fake) and (fake - mean real), each divided
    by the detached std of all logits of that block."""
    total: torch.Tensor | float = 0.0
    for r, f in zip(real, fake):
        scale = torch.cat([r.flatten(), f.flatten()]).detach().std().clamp_min(1e-3)
        d_real = (r - f.mean()) / scale
        d_fake = (f - r.mean()) / scale
        if for_generator:
            total = total + F.softplus(d_real).mean() + F.softplus(-d_fake).mean()
        else:
            total = total + F.softplus(-d_real).mean() + F.softplus(d_fake).mean()
    return cast(torch.Tensor, total) / len(real)  # a tensor after the first block


class Adversary:
    """The discriminator, its AdamW, its replay buffer and the two losses, for one rank."""

    def __init__(
        self, cfg: AdversarialSection, latent_channels: int, device: torch.device | str, seed: int
    ) -> None:
        gen = torch.Generator().manual_seed(seed + 7919)  # its own init, not a draw from the trainer's RNG
        self.net = PatchDiscriminator(latent_channels, cfg.width)
        with torch.no_grad():
            for p in self.net.parameters():
                if p.ndim > 1:
                    p.copy_(torch.randn(p.shape, generator=gen) * (2.0 / p[0].numel()) ** 0.5)
        self.net.to(device).train()
        self.opt = AdamW(self.net.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=0.0, fused=True)
        self.replay_size = cfg.replay
        self.replay: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.gen = torch.Generator().manual_seed(seed + 104729)

    def generator_loss(self, fake: torch.Tensor, real: torch.Tensor, latents: torch.Tensor) -> torch.Tensor:
        """The decoder's term; gradients reach the decoder only (the discriminator is frozen here)."""
        f, c = frame_groups(fake, latents.detach())
        r, _ = frame_groups(real, latents.detach())
        self.net.requires_grad_(False)
        try:
            return _relativistic(self.net(r, c), self.net(f.float(), c), for_generator=True)
        finally:
            self.net.requires_grad_(True)

    def discriminator_step(
        self, fake: torch.Tensor, real: torch.Tensor, latents: torch.Tensor
    ) -> torch.Tensor:
        """One update on detached fakes plus replayed ones; gradients averaged over all ranks. Returns
        the loss as a device tensor (metrics leave the device only at log steps)."""

        f, c = frame_groups(fake.detach().float(), latents.detach().float())
        r, rc = frame_groups(real.float(), latents.detach().float())
        current = (f, c)
        if self.replay:
            pick = torch.randint(
                len(self.replay), (min(len(self.replay), f.shape[0]),), generator=self.gen
            ).tolist()
            f = torch.cat([f, *[self.replay[i][0] for i in pick]])
            c = torch.cat([c, *[self.replay[i][1] for i in pick]])
        self._remember(*current)
        loss = _relativistic(self.net(r, rc), self.net(f, c), for_generator=False)
        self.opt.zero_grad(set_to_none=False)
        loss.backward()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            # zero_grad(set_to_none=False) and backward: every parameter has its grad
            grads = cast(list[torch.Tensor], [p.grad for p in self.net.parameters()])
            flat = torch.cat([g.flatten() for g in grads])
            dist.all_reduce(flat)
            flat /= dist.get_world_size()
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        self.opt.step()
        return loss.detach()

    def _remember(self, frames: torch.Tensor, cond: torch.Tensor) -> None:
        if self.replay_size <= 0:
            return
        for i in range(frames.shape[0]):
            item = (frames[i : i + 1].detach().clone(), cond[i : i + 1].detach().clone())
            if len(self.replay) < self.replay_size:
                self.replay.append(item)
            else:
                self.replay[int(torch.randint(self.replay_size, (1,), generator=self.gen))] = item

    def broadcast_from_rank0(self) -> None:
        """Start every rank from rank 0's weights (seeded alike, but a resume or a custom init must agree)."""

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            for t in [*self.net.parameters(), *self.net.buffers()]:
                dist.broadcast(t.data, 0)

    # ------------------------------------------------------------------ checkpoint
    def save(self, directory: Path) -> None:
        """Rank 0: weights as safetensors, optimizer state as a torch archive (no pickled code)."""

        save_file(
            {k: v.detach().cpu().contiguous() for k, v in self.net.state_dict().items()},
            str(directory / WEIGHTS),
        )
        torch.save(self.opt.state_dict(), directory / OPTIMIZER)

    def load(self, directory: Path) -> None:

        device = next(self.net.parameters()).device
        self.net.load_state_dict({k: v.to(device) for k, v in load_file(str(directory / WEIGHTS)).items()})
        self.opt.load_state_dict(torch.load(directory / OPTIMIZER, map_location=device, weights_only=True))

    def digest(self) -> str:
        return state_digest(self.net.state_dict())

    def optimizer_steps(self) -> int:
        steps = [int(s["step"]) for s in self.opt.state.values() if "step" in s]
        return max(steps, default=0)


def state_digest(state: dict) -> str:
    """A hash of a state dict's names and values, to show that two copies are equal."""
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]
