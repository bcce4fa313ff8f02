"""FLOPs of a TAEHV training step and the GPUs' dense bf16 peaks: MFU, as the trainer reports it
(the step event's `mfu`) and benchmarks/gpu_throughput.py measures it. No torch here: the console
reads it too.

The FLOPs are counted from the architecture of each family (trainer/families.py, trainer/model.py),
layer by layer, as torch's FlopCounterMode counts the model's own convolutions (2 x multiply-adds,
biases not counted): tests/trainer/test_family_flops.py checks the count against FlopCounterMode
over TAEHV.for_family(f) for every family at several clip sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from trainer.families import DEFAULT_FAMILY, FAMILIES, FrameChunks, Strides

# FACTS (the author's model, counted per 12x480x720 clip): forward 0.628 TFLOP in the encoder and
# 1.413 TFLOP in the decoder; a training step is forward + backward (twice the forward) of both,
# ~6.1 TFLOP. The count below gives taehv 0.627 + 1.404 (the decoder's last two convolutions run on
# the 9 frames it keeps, not 12) and 6.07 for the step: within 1 % of these.
ENCODER_FORWARD = 0.628e12
DECODER_FORWARD = 1.413e12
FLOP_PER_CLIP_STEP = 6.1e12
REFERENCE_CLIP = (12, 480, 720)
REFERENCE_VOXELS = 12 * 480 * 720


class ModelKnobs(Protocol):
    """The `[model]` section's shape knobs (trainer.config.ModelSection): read, never written."""

    @property
    def family(self) -> str: ...
    @property
    def latent_channels(self) -> int: ...
    @property
    def patch_size(self) -> int: ...
    @property
    def encoder_time_downscale(self) -> Strides: ...
    @property
    def decoder_time_upscale(self) -> Strides: ...
    @property
    def decoder_space_upscale(self) -> Strides: ...


@dataclass(frozen=True)
class Architecture:
    """What a model's cost depends on: the shapes TAEHV.for_family (or a `custom` [model]) builds."""

    latent_channels: int = 16
    patch_size: int = 1
    encoder_time_downscale: Strides = (True, True, False)
    decoder_time_upscale: Strides = (False, True, True)
    decoder_space_upscale: Strides = (True, True, True)
    super_decoder: bool = False
    untrimmed_even_latents: bool = False
    chunks: FrameChunks | None = None


ModelLike = str | ModelKnobs | Architecture


def architecture(model: ModelLike = DEFAULT_FAMILY) -> Architecture:
    """The architecture of a family (by name), of a run config's `[model]` (its family's, or for
    `custom` its knobs as written, as trainer.model.build_model builds it), or `model` itself."""
    if isinstance(model, Architecture):
        return model
    name = model if isinstance(model, str) else model.family
    fam = FAMILIES.get(name)
    if fam is not None:
        return Architecture(
            fam.latent_channels,
            fam.patch_size,
            fam.encoder_time_downscale,
            fam.decoder_time_upscale,
            super_decoder=fam.super_decoder,
            untrimmed_even_latents=fam.untrimmed_even_latents,
            chunks=fam.chunks,
        )
    if isinstance(model, str):
        raise KeyError(f"unknown family {model!r}; known: {', '.join(FAMILIES)}")
    return Architecture(
        model.latent_channels,
        model.patch_size,
        tuple(model.encoder_time_downscale),  # type: ignore[arg-type]
        tuple(model.decoder_time_upscale),  # type: ignore[arg-type]
        tuple(model.decoder_space_upscale),  # type: ignore[arg-type]
    )


def _conv(c_in: int, c_out: int, k: int, pixels: int, groups: int = 1) -> int:
    """A k x k convolution's FLOPs over `pixels` output pixels (frames folded in), as FlopCounterMode
    counts them: 2 x multiply-adds, the bias not counted."""
    return 2 * (c_in // groups) * c_out * k * k * pixels


def _memblock(n: int, pixels: int) -> int:
    # conv 3x3 2n -> n on concat(x, past), two conv 3x3 n -> n; the skip is identity (widths equal)
    return _conv(2 * n, n, 3, pixels) + 2 * _conv(n, n, 3, pixels)


def _super_memblock(n: int, pixels: int) -> int:
    # on concat(x, past): 7x7 depthwise over 2n, 1x1 2n -> 4n, 1x1 4n -> n
    return (
        _conv(2 * n, 2 * n, 7, pixels, groups=2 * n)
        + _conv(2 * n, 4 * n, 1, pixels)
        + _conv(4 * n, n, 1, pixels)
    )


@dataclass(frozen=True)
class ForwardFlops:
    """One clip's forward FLOPs through encoder and decoder, and the first convolution of each (its
    input needs no gradient when it is the clip, or the teacher's latents: backward skips that
    convolution's input gradient)."""

    encoder: int
    decoder: int
    encoder_input_conv: int
    decoder_input_conv: int
    latents: int  # latent frames the encoder yields (and the decoder reads)
    decoded_frames: int  # frames decode() returns (the warm-up ones dropped)

    @property
    def total(self) -> int:
        return self.encoder + self.decoder


def _kept(a: Architecture, latents: int, out_frames: int) -> int:
    """How many of the decoder's out_frames decode() keeps (trainer.model.TAEHV.kept_frames)."""
    if a.chunks is not None:
        period = a.chunks.frames + a.chunks.lead
        return sum(1 for i in range(out_frames) if i % period >= a.chunks.lead)
    if a.untrimmed_even_latents and latents % 2 == 0:
        return out_frames
    return out_frames - (2 ** sum(a.decoder_time_upscale) - 1)


def _encoder(a: Architecture, frames: int, h: int, w: int) -> tuple[int, int, int]:
    """(FLOPs, first conv's FLOPs, latent frames) of encoding one video of `frames` frames at h x w
    (after the pixel unshuffle)."""
    width = 64
    first = _conv(3 * a.patch_size**2, width, 3, frames * h * w)
    flops, t = first, frames
    for down in a.encoder_time_downscale:
        s = 2 if down else 1
        t //= s
        flops += _conv(width * s, width, 1, t * h * w)  # TPool
        h, w = -(-h // 2), -(-w // 2)
        flops += _conv(width, width, 3, t * h * w)  # 3x3, stride 2
        flops += 3 * _memblock(width, t * h * w)
    flops += _conv(width, a.latent_channels, 3, t * h * w)
    return flops, first, t


def _decoder(a: Architecture, k: int, h: int, w: int) -> tuple[int, int, int]:
    """(FLOPs, first conv's FLOPs, frames kept) of decoding k latents at h x w, in the order the
    trainer runs it (trainer.model.run_order: each TGrow before its nearest upsample) and with the
    warm-up frames dropped before the last, per-frame stage (TAEHV.decode)."""
    head = 3 * a.patch_size**2
    t = k
    if a.super_decoder:
        first = _conv(a.latent_channels, 512, 1, k * h * w)
        flops = first
        for n, nxt, t_up, s_up in zip(
            (512, 256, 128), (256, 128, 64), a.decoder_time_upscale, a.decoder_space_upscale
        ):
            flops += 3 * _super_memblock(n, t * h * w)
            s = 2 if s_up else 1
            flops += _conv(n, nxt * s * s, 3, t * h * w)
            h, w = h * s, w * s  # PixelShuffle(s)
            st = 2 if t_up else 1
            flops += _conv(nxt, nxt * st, 1, t * h * w)  # TGrow
            t *= st
        kept = _kept(a, k, t)
        return flops + _conv(64, head, 3, kept * h * w), first, kept
    widths = (256, 128, 64, 64)
    first = _conv(a.latent_channels, widths[0], 3, k * h * w)
    flops = first + 3 * _memblock(widths[0], k * h * w)
    for i, (t_up, s_up) in enumerate(zip(a.decoder_time_upscale, a.decoder_space_upscale)):
        n, nxt = widths[i], widths[i + 1]
        st = 2 if t_up else 1
        flops += _conv(n, n * st, 1, t * h * w)  # TGrow, before the upsample
        t *= st
        if s_up:
            h, w = 2 * h, 2 * w
        if i < 2:
            flops += _conv(n, nxt, 3, t * h * w) + 3 * _memblock(nxt, t * h * w)
    kept = _kept(a, k, t)
    return (
        flops + _conv(widths[2], widths[3], 3, kept * h * w) + _conv(widths[3], head, 3, kept * h * w),
        first,
        kept,
    )


def forward_flops(model: ModelLike, frames: int, height: int, width: int) -> ForwardFlops:
    """One clip's forward FLOPs (encode, then decode of its latents) for a family or `[model]`, as
    trainer/model.py runs it: frames padded to the family's quantum, H3's clip cut into 17-frame
    chunks each behind 3 zero frames and its last 3 latents dropped."""
    a = architecture(model)
    h, w = height // a.patch_size, width // a.patch_size
    if a.chunks is not None:
        c = a.chunks
        videos = -(-frames // c.frames)
        enc, enc_first, per_video = _encoder(a, c.frames + c.lead, h, w)
        enc, enc_first = enc * videos, enc_first * videos
        latents = per_video * videos - c.dropped_latents
    else:
        q = 2 ** sum(a.encoder_time_downscale)
        enc, enc_first, latents = _encoder(a, -(-frames // q) * q, h, w)
    dec, dec_first, kept = _decoder(a, latents, -(-h // 8), -(-w // 8))
    return ForwardFlops(enc, dec, enc_first, dec_first, latents, kept)


def flop_per_clip_step(
    frames: int, height: int, width: int, teacher_decode: bool = False, model: ModelLike = DEFAULT_FAMILY
) -> float:
    """FLOPs of one training step of one clip of `model` (a family's name or a run's `[model]`):
    forward and backward of encode and decode, plus (the distillation recipe with
    decoder_on_teacher_latents) a second decode, of the teacher's latents (as many as the student's).
    Backward is twice the forward, less the input gradient of a convolution whose input is the clip or
    the teacher's latents (none is computed)."""
    f = forward_flops(model, frames, height, width)
    step = 3 * f.total - f.encoder_input_conv
    if teacher_decode:
        step += 3 * f.decoder - f.decoder_input_conv
    return float(step)


def decoder_share(model: ModelLike = DEFAULT_FAMILY, clip: tuple[int, int, int] = REFERENCE_CLIP) -> float:
    """The decoder's share of the forward FLOPs."""
    f = forward_flops(model, *clip)
    return f.decoder / f.total


# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, matched in order against the device name that
# torch / NVML report (e.g. "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200"). FACTS.md
# gives the H100 SXM's 989; the rest are NVIDIA's datasheets, which print the sparse figure (twice
# the dense one): H100 SXM 1,979 / PCIe 1,513 / NVL 1,671; H200 SXM 1,979 / NVL 1,671; A100 and
# A800 312 dense; L40S 733 sparse (362 dense).
DATASHEET_BF16_DENSE: tuple[tuple[tuple[str, ...], float, str], ...] = (
    (("H100", "PCIE"), 756.0, "NVIDIA H100 datasheet, PCIe: 1,513 sparse"),
    (("H100", "NVL"), 835.0, "NVIDIA H100 datasheet, NVL: 1,671 sparse"),
    (("H100",), 989.0, "FACTS.md; NVIDIA H100 datasheet, SXM: 1,979 sparse"),
    (("H200", "NVL"), 835.0, "NVIDIA H200 datasheet, NVL: 1,671 sparse"),
    (("H200",), 989.0, "NVIDIA H200 datasheet, SXM: 1,979 sparse"),
    (("A100",), 312.0, "NVIDIA A100 datasheet"),
    (("A800",), 312.0, "NVIDIA A800 datasheet (A100 silicon)"),
    (("L40S",), 362.0, "NVIDIA L40S datasheet: 733 sparse"),
)
H100_BF16_PEAK = 989e12  # the goal's card (H100 SXM), FLOP/s
# Below this share of the peak a run is crawling: the public project's 3-4 %; this model reaches
# ~20 % on an H100 with channels_last and compile (docs/performance.md).
LOW_MFU = 0.10


def datasheet_peak(name: str) -> tuple[float | None, str]:
    """(dense bf16 TFLOP/s, where the figure comes from) for a device name; (None, why) if unknown."""
    upper = name.upper()
    for keys, tflops, source in DATASHEET_BF16_DENSE:
        if all(k in upper for k in keys):
            return tflops, source
    return None, f"no datasheet figure for {name!r}"


def mfu(
    clips_per_s: float,
    frames: int,
    height: int,
    width: int,
    gpus: int,
    peak_tflops: float,
    teacher_decode: bool = False,
    model: ModelLike = DEFAULT_FAMILY,
) -> float:
    """Model FLOPs utilisation per GPU: the step's model FLOPs at `clips_per_s` (clips, or crops,
    of frames x height x width over the whole run) against `gpus` x the dense bf16 peak. The
    teacher's own forward and the discriminator are not the model's FLOPs and are not counted.
    `model`: the run's family (or `[model]`), whose FLOPs these are."""
    flop = flop_per_clip_step(frames, height, width, teacher_decode, model)
    return clips_per_s * flop / (gpus * peak_tflops * 1e12)
