"""TAEHV one frame at a time, each MemBlock carrying the previous frame's input as its memory:
the streaming path, whose memory does not grow with the clip's length (a player or a long video),
and which must give what the parallel path (trainer/model.py, all frames at once) gives."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from trainer.model import MEMORY_BLOCKS, TAEHV, TGrow, TPool


class LayerStream:
    """A sequence of TAEHV layers fed frame by frame (N×C×H×W each). A MemBlock remembers its last
    input (zeros before the first frame, as the parallel path's shift gives), a TPool gathers
    `stride` frames before it emits one, a TGrow emits `stride` frames for each it takes. A
    SuperMemBlock remembers as a MemBlock does."""

    def __init__(self, layers: Iterable[nn.Module]):
        self.layers = list(layers)
        self.memory: list[torch.Tensor | None] = [None] * len(self.layers)
        self.pending: list[list[torch.Tensor]] = [[] for _ in self.layers]

    def push(self, frame: torch.Tensor) -> list[torch.Tensor]:
        """Feed one frame; the frames that come out of the last layer (none, one or several)."""
        return self._feed(0, frame)

    def _feed(self, i: int, x: torch.Tensor) -> list[torch.Tensor]:
        if i == len(self.layers):
            return [x]
        layer = self.layers[i]
        if isinstance(layer, MEMORY_BLOCKS):
            past = self.memory[i]
            self.memory[i] = x
            return self._feed(i + 1, layer(x, torch.zeros_like(x) if past is None else past))
        if isinstance(layer, TPool):
            self.pending[i].append(x)
            if len(self.pending[i]) < layer.stride:
                return []
            # consecutive frames side by side in channels: the parallel path's reshape of N·T frames
            stacked = torch.cat(self.pending[i], 1)
            self.pending[i] = []
            return self._feed(i + 1, layer.conv(stacked))
        if isinstance(layer, TGrow):
            n, c, h, w = x.shape
            grown = layer.conv(x).reshape(n, layer.stride, c, h, w)
            return [out for j in range(layer.stride) for out in self._feed(i + 1, grown[:, j])]
        return self._feed(i + 1, layer(x))


def stream_encode(model: TAEHV, x: torch.Tensor) -> torch.Tensor:
    """N×T×3×H×W in [0, 1] -> N×(T/4)×latent×(H/8)×(W/8), frame by frame; padded at the end like
    TAEHV.encode (the last frame repeated to a multiple of the time downscale). H3: each 17-frame
    chunk streams into a fresh encoder behind its 3 zero frames; the last 3 latents are dropped."""
    x = model.pad_frames(x)
    if model.chunks is None:
        return torch.stack(_stream_frames(model, LayerStream(model.encoder), x.unbind(1)), 1)
    c = model.chunks
    zeros = [torch.zeros_like(x[:, 0])] * c.lead
    latents: list[torch.Tensor] = []
    for start in range(0, x.shape[1], c.frames):
        latents += _stream_frames(
            model, LayerStream(model.encoder), zeros + list(x[:, start : start + c.frames].unbind(1))
        )
    return torch.stack(latents[: -c.dropped_latents], 1)


def _stream_frames(model: TAEHV, stream: LayerStream, frames: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for frame in frames:
        if model.patch_size > 1:
            frame = F.pixel_unshuffle(frame, model.patch_size)
        out += stream.push(frame)
    return out


def stream_decode(model: TAEHV, z: torch.Tensor, clamp: bool = True) -> torch.Tensor:
    """N×K×latent×h×w -> N×(4K−3)×3×8h×8w, latent by latent; the warm-up frames dropped as
    TAEHV.decode drops them (its family's kept_frames)."""
    stream = LayerStream(model.decoder)
    frames: list[torch.Tensor] = []
    for k in range(z.shape[1]):
        for frame in stream.push(z[:, k]):
            if model.patch_size > 1:
                frame = F.pixel_shuffle(frame, model.patch_size)
            frames.append(frame.clamp(0, 1) if clamp else frame)
    kept = model.kept_frames(z.shape[1])
    return torch.stack(frames[kept] if isinstance(kept, slice) else [frames[i] for i in kept], 1)


def stream_forward(model: TAEHV, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(latents, reconstruction) as TAEHV.forward gives them, one frame at a time."""
    z = stream_encode(model, x)
    return z, stream_decode(model, z)
