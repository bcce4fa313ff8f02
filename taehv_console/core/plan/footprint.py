"""TAEHV's size in numbers: parameter count and activation elements per clip, from the architecture.

The planner needs both without building the model (no torch at plan time), so they are computed
from the layer list in FACTS.md. The parameter count is exact (it reproduces the published
11,315,539); the activation count is an estimate, explained in `activation_elements`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from trainer.config import ModelSection
from trainer.flops import architecture

ENCODER_WIDTH = 64
DECODER_WIDTHS = (256, 128, 64)
SUPER_WIDTHS = (512, 256, 128, 64)  # the `_super` decoder's widths (families with super_decoder)
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

    if architecture(model).super_decoder:
        return ParameterCount(
            encoder=enc, decoder=_super_decoder_parameters(model.latent_channels, p2, model)
        )
    dec = _conv3x3(model.latent_channels, DECODER_WIDTHS[0])
    nexts = DECODER_WIDTHS[1:] + (DECODER_WIDTHS[-1],)
    for n, nxt, up in zip(DECODER_WIDTHS, nexts, model.decoder_time_upscale):
        stride = 2 if up else 1
        dec += MEMBLOCKS_PER_STAGE * _memblock(n)
        dec += n * n * stride  # TGrow: 1x1 conv, no bias, n -> n * stride
        dec += _conv3x3(n, nxt, bias=False)
    dec += _conv3x3(DECODER_WIDTHS[-1], 3 * p2)
    return ParameterCount(encoder=enc, decoder=dec)


def _super_decoder_parameters(latent_channels: int, p2: int, model: ModelSection) -> int:
    """The `_super` decoder (trainer/model.py): a bias-free 1x1 to 512; per stage 3 SuperMemBlocks
    (7x7 depthwise over 2n, no bias; 1x1 2n -> 4n with bias; 1x1 4n -> n, no bias), a 3x3 conv to the
    next width x s^2, the TGrow; the 3x3 head."""
    a = architecture(model)
    dec = latent_channels * SUPER_WIDTHS[0]
    for n, nxt, t_up, s_up in zip(
        SUPER_WIDTHS, SUPER_WIDTHS[1:], a.decoder_time_upscale, a.decoder_space_upscale
    ):
        s = 2 if s_up else 1
        dec += MEMBLOCKS_PER_STAGE * (2 * n * 49 + (2 * n * 4 * n + 4 * n) + 4 * n * n)
        dec += _conv3x3(n, nxt * s * s)
        dec += nxt * nxt * (2 if t_up else 1)
    return dec + _conv3x3(SUPER_WIDTHS[-1], 3 * p2)


@dataclass(frozen=True)
class ActivationCount:
    """Activation elements for one clip.

    `encoder` + `decoder` (= `saved`) are what autograd keeps between forward and backward (with
    checkpointing: stage inputs plus the one stage being recomputed). `largest_stage` is the
    biggest stage's contents: backward's gradients through that stage mirror its activations, so
    `peak` = saved + largest_stage is the high-water mark of one clip's training step.
    """

    encoder: int
    decoder: int
    largest_stage: int

    @property
    def saved(self) -> int:
        return self.encoder + self.decoder

    @property
    def total(self) -> int:  # the name earlier callers use for `saved`
        return self.saved

    @property
    def peak(self) -> int:
        return self.saved + self.largest_stage


def _stages(model: ModelSection, frames: int, height: int, width: int) -> list[tuple[str, int, int]]:
    """(part, input elements, elements saved inside) for each stage trainer/model.py checkpoints.

    trainer/model.py cuts each of encoder and decoder after every run of MemBlocks, so a stage is
    e.g. [TPool, strided conv, 3 MemBlocks] or [Upsample, TGrow, conv, 3 MemBlocks]. A stage's
    input is the previous stage's output, which that stage already counted as saved (its last
    ReLU output), so "inside" never counts it twice.
    """
    a = architecture(model)
    p = model.patch_size
    p2 = p * p
    w = ENCODER_WIDTH
    if a.chunks is not None:  # H3: each 17-frame chunk encoded behind 3 zero frames
        frames = -(-frames // a.chunks.frames) * (a.chunks.frames + a.chunks.lead)
    t, h, wd = frames, height // p, width // p
    per_mb = 5 * MEMBLOCKS_PER_STAGE  # 5n per pixel and frame per MemBlock, see activation_elements
    out: list[tuple[str, int, int]] = []

    stage_in = 3 * p2 * t * h * wd
    inside = stage_in + w * t * h * wd  # the clip (first conv's input) and the first ReLU output
    for down in model.encoder_time_downscale:
        t = -(-t // 2) if down else t
        inside += w * t * h * wd  # TPool output = the strided conv's input
        h, wd = -(-h // 2), -(-wd // 2)
        # the strided conv's output is the first block's x: nobody saves it (identity skip)
        inside += per_mb * w * t * h * wd
        out.append(("encoder", stage_in, inside))
        stage_in, inside = w * t * h * wd, 0
    # conv(64, latent) saves its input (counted) and nothing new; it ends the encoder

    lat = model.latent_channels
    if a.chunks is not None:
        t -= a.chunks.dropped_latents
    if a.super_decoder:
        return out + _super_stages(model, lat, t, h, wd)
    stage_in = lat * t * h * wd
    n0 = DECODER_WIDTHS[0]
    inside = lat * t * h * wd + n0 * t * h * wd  # tanh clamp output, conv(latent, 256)+ReLU output
    inside += per_mb * n0 * t * h * wd
    out.append(("decoder", stage_in, inside))
    nexts = DECODER_WIDTHS[1:] + (DECODER_WIDTHS[-1],)
    for i, (n, nxt) in enumerate(zip(DECODER_WIDTHS, nexts)):
        stage_in = n * t * h * wd
        if model.decoder_space_upscale[i]:
            h, wd = h * 2, wd * 2
        s = 2 if model.decoder_time_upscale[i] else 1
        inside = n * t * h * wd  # the upsampled tensor = TGrow's input
        t *= s
        inside += n * t * h * wd  # TGrow's output = the stage conv's input
        if i + 1 < len(DECODER_WIDTHS):
            inside += per_mb * nxt * t * h * wd  # the next width's MemBlocks (conv output unsaved)
        else:
            inside += nxt * t * h * wd  # final ReLU output = conv(64, 3p^2)'s input
        out.append(("decoder", stage_in, inside))
    return out


def _super_stages(model: ModelSection, lat: int, t: int, h: int, wd: int) -> list[tuple[str, int, int]]:
    """The `_super` decoder's stages, as `_stages` counts them. A SuperMemBlock of width n keeps 8n
    values per pixel and frame: concat(x, past) for the depthwise conv (2n), its output for the 1x1
    (2n), the in-place ReLU's output (4n); the sum with x keeps nothing. Each later stage keeps its
    input (the conv's), the ReLU output (next x s^2) and PixelShuffle's copy (TGrow's input)."""
    a = architecture(model)
    per_smb = 8 * MEMBLOCKS_PER_STAGE
    n0 = SUPER_WIDTHS[0]
    out = [("decoder", lat * t * h * wd, lat * t * h * wd + per_smb * n0 * t * h * wd)]
    for i, (n, nxt) in enumerate(itertools.pairwise(SUPER_WIDTHS)):
        s = 2 if a.decoder_space_upscale[i] else 1
        stage_in = n * t * h * wd
        inside = stage_in + nxt * s * s * t * h * wd  # the conv's input, the ReLU's output
        h, wd = h * s, wd * s
        inside += nxt * t * h * wd  # PixelShuffle's output = TGrow's input
        t *= 2 if a.decoder_time_upscale[i] else 1
        # the next width's blocks, or after the last stage the head conv's input (TGrow's output)
        inside += (per_smb if i + 1 < len(SUPER_WIDTHS) - 1 else 1) * nxt * t * h * wd
        out.append(("decoder", stage_in, inside))
    return out


def activation_elements(model: ModelSection, frames: int, height: int, width: int) -> ActivationCount:
    """Estimate the activation elements autograd keeps for one clip of frames x height x width.

    How: walk the layers and count the tensors backward needs, at the resolution and frame count
    each layer runs at. A conv keeps its input, a ReLU (in place, as TAEHV uses them) and the
    decoder's tanh clamp keep their output; a concat, a time shift, an addition or a nearest
    upsample keep nothing of their own. That gives, per MemBlock of width n, 5n values per pixel
    and frame: the concat(x, past) fed to the first conv (2n), the two inner ReLU outputs (n each)
    and the block's output ReLU (n). The encoder runs 64 channels at full resolution and frame
    count, then 1/2, 1/4 and 1/8 of the resolution with its time strides; the decoder runs
    256/128/64 channels at 1/8, 1/4, 1/2 and full resolution with its time strides. The
    reconstruction (3 channels, full size) is kept by the loss.

    With activation checkpointing (trainer/model.py checkpoints each stage that ends in a run of
    MemBlocks, and the tail) only each stage's input is kept, and backward recomputes one stage
    at a time: the largest stage's contents are added once (per clip; the planner multiplies by
    the micro-batch, since a stage is recomputed for the whole micro-batch).

    Backward adds the gradients flowing through a stage, as large as its activations: `peak`
    adds the largest stage once more. Checked against benchmarks/activation_memory.py (peak RSS
    of a real fp32 step on CPU, 12x120x176, one clip): measured 876 MB without checkpointing and
    551 MB with; `peak` x 4 bytes + the planner's 10% workspace gives 921 MB and 524 MB.

    Not counted: the teacher VAE, cuDNN workspaces, allocator slack; the planner's workspace
    margin stands for those.
    """
    stages = _stages(model, frames, height, width)
    recon = 3 * frames * height * width
    part, largest = max(((p, i + s) for p, i, s in stages), key=lambda x: x[1])
    sums = {"encoder": 0, "decoder": recon}
    if model.activation_checkpointing:
        for p, stage_in, _ in stages:
            sums[p] += stage_in
        sums[part] += largest  # the stage being recomputed
    else:
        for p, _, inside in stages:
            sums[p] += inside
    return ActivationCount(encoder=sums["encoder"], decoder=sums["decoder"], largest_stage=largest)
