"""TAEHV's size in numbers: parameter count and activation elements per clip, from the architecture.

The planner needs both without building the model (no torch at plan time), so they are computed
from the layer list in FACTS.md. The parameter count is exact (it reproduces the published
11,315,539); the activation count is an estimate, explained in `activation_elements`.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.config import ModelSection

ENCODER_WIDTH = 64
DECODER_WIDTHS = (256, 128, 64)
MEMBLOCKS_PER_STAGE = 3


def _conv3x3(n_in: int, n_out: int, bias: bool = True) -> int:
    return n_in * n_out * 9 + (n_out if bias else 0)


def _memblock(n: int) -> int:
    # conv(2n, n) + conv(n, n) + conv(n, n), all with bias; the skip is identity (n_in == n_out)
    return _conv3x3(2 * n, n) + 2 * _conv3x3(n, n)


@dataclass(frozen=True)
class ParameterCount:
    encoder: int
    decoder: int

    @property
    def total(self) -> int:
        return self.encoder + self.decoder


def parameter_count(model: ModelSection) -> ParameterCount:
    """Exact parameter count of the model `trainer/model.py` builds for these settings."""
    p2 = model.patch_size**2
    w = ENCODER_WIDTH
    enc = _conv3x3(3 * p2, w)
    for down in model.encoder_time_downscale:
        stride = 2 if down else 1
        enc += w * stride * w  # TPool: 1x1 conv, no bias, from `stride` stacked frames
        enc += _conv3x3(w, w, bias=False)  # spatial stride-2 conv
        enc += MEMBLOCKS_PER_STAGE * _memblock(w)
    enc += _conv3x3(w, model.latent_channels)

    dec = _conv3x3(model.latent_channels, DECODER_WIDTHS[0])
    nexts = DECODER_WIDTHS[1:] + (DECODER_WIDTHS[-1],)
    for n, nxt, up in zip(DECODER_WIDTHS, nexts, model.decoder_time_upscale):
        stride = 2 if up else 1
        dec += MEMBLOCKS_PER_STAGE * _memblock(n)
        dec += n * n * stride  # TGrow: 1x1 conv, no bias, n -> n * stride
        dec += _conv3x3(n, nxt, bias=False)
    dec += _conv3x3(DECODER_WIDTHS[-1], 3 * p2)
    return ParameterCount(encoder=enc, decoder=dec)


@dataclass(frozen=True)
class ActivationCount:
    """Elements kept for backward for one clip; `peak_block` is the largest single MemBlock's share."""

    encoder: int
    decoder: int
    peak_block: int

    @property
    def total(self) -> int:
        return self.encoder + self.decoder


def activation_elements(model: ModelSection, frames: int, height: int, width: int) -> ActivationCount:
    """Estimate the activation elements autograd keeps for one clip of frames x height x width.

    How: walk the layers and count the tensors backward needs, at the resolution and frame count
    each layer runs at. A conv keeps its input, a ReLU (in place, as TAEHV uses them) and the
    decoder's tanh clamp keep their output; a concat, a time shift, an addition or a nearest
    upsample keep nothing of their own. That gives, per MemBlock of width n, 5n values per pixel
    and frame: the concat(x, past) fed to the first conv (2n), the two inner ReLU outputs (n each)
    and the block's output ReLU (n). The encoder runs 64 channels at full resolution and frame
    count, then 1/2, 1/4 and 1/8 of the resolution with its time strides; the decoder runs
    256/128/64 channels at 1/8, 1/4, 1/2 and full resolution with its time strides.

    With activation checkpointing (one checkpoint per MemBlock) a block keeps only its input, n per
    pixel, and during backward one block at a time is recomputed: `peak_block` is that transient.

    Not counted: the loss's own temporaries, the teacher VAE, cuDNN workspaces; the planner adds a
    workspace margin for those.
    """
    p = model.patch_size
    p2 = p * p
    w = ENCODER_WIDTH
    t, h, wd = frames, height // p, width // p
    ckpt = model.activation_checkpointing
    per_block = 1 if ckpt else 5
    peak = 0

    def blocks(n: int, t: int, h: int, wd: int) -> int:
        nonlocal peak
        peak = max(peak, 5 * n * t * h * wd)
        return MEMBLOCKS_PER_STAGE * per_block * n * t * h * wd

    enc = 3 * p2 * t * h * wd  # the clip, input of the first conv
    enc += w * t * h * wd  # first ReLU output (also the first TPool's input)
    for down in model.encoder_time_downscale:
        t = -(-t // 2) if down else t
        enc += w * t * h * wd  # TPool output = the strided conv's input
        h, wd = -(-h // 2), -(-wd // 2)
        # the strided conv's output is the first block's x: saved by nobody (identity skip)
        enc += blocks(w, t, h, wd)
    # last block's output ReLU is already counted; it is the input of conv(64, latent)

    dec = model.latent_channels * t * h * wd  # tanh clamp output
    dec += DECODER_WIDTHS[0] * t * h * wd  # conv(latent, 256) + ReLU output
    nexts = DECODER_WIDTHS[1:] + (DECODER_WIDTHS[-1],)
    for n, nxt, up_t, up_s in zip(
        DECODER_WIDTHS, nexts, model.decoder_time_upscale, model.decoder_space_upscale
    ):
        dec += blocks(n, t, h, wd)
        if up_s:
            h, wd = h * 2, wd * 2
        dec += n * t * h * wd  # upsampled tensor = TGrow's input
        s = 2 if up_t else 1
        dec += n * s * t * h * wd  # TGrow output = the stage's last conv's input
        t *= s
        # the stage conv's output feeds the next stage's first block (not saved), except the last
    dec += DECODER_WIDTHS[-1] * t * h * wd  # final ReLU output = conv(64, 3p^2)'s input
    dec += 3 * p2 * t * h * wd  # the reconstruction, kept by the loss
    return ActivationCount(encoder=enc, decoder=dec, peak_block=peak if ckpt else 0)
