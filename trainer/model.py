"""TAEHV: a tiny causal video autoencoder (8x space, 4x time, 16 latent channels), and the other TAE
families the author publishes (trainer/families.py): other widths, patch sizes, time scales, frame
conventions and the wider `_super` decoder.

Built from the published description with the published parameter names, so the author's weights
(`taehv.pth`, `taew2_2.pth`, ...) load into the model of their family (TAEHV.for_family, or
TAEHV.from_file, which tells the family from the file). Video tensors are N×T×C×H×W in [0, 1];
every layer runs on all frames at once (time folded into the batch).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch._functorch import config as functorch_config
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:
    from trainer.config import ModelSection

from trainer.errors import WeightsError
from trainer.families import (
    FAMILIES,
    FamilyError,
    FrameChunks,
    Strides,
    families_with_shapes,
    family_from_name,
    get_family,
)
from trainer.frame_ops import (
    CatPast,
    channels_to_frames,
    drop_leading_frames,
    frames_to_channels,
    keep_frames,
    same_layout,
    shift_one_frame,
    upsample_nearest,
)


def conv(n_in: int, n_out: int, **kwargs: Any) -> nn.Conv2d:
    return nn.Conv2d(n_in, n_out, 3, padding=1, **kwargs)


class Clamp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / 3) * 3


class MemBlock(nn.Module):
    """Conv stack over (x, the same block's input one frame earlier); 1x1 skip when widths differ."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.conv = nn.Sequential(
            conv(n_in * 2, n_out),
            nn.ReLU(inplace=True),
            conv(n_out, n_out),
            nn.ReLU(inplace=True),
            conv(n_out, n_out),
        )
        self.skip = nn.Conv2d(n_in, n_out, 1, bias=False) if n_in != n_out else nn.Identity()
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor, past: torch.Tensor | None = None, n: int = 1) -> torch.Tensor:
        """past=None: each frame's past is its predecessor in x, frames (N*T, ...) of n videos."""
        xp = CatPast.apply(x, n) if past is None else torch.cat([x, past], 1)
        return self.act(self.conv(xp) + self.skip(x))


class SuperMemBlock(nn.Module):
    """The `_super` decoder's block: on (x, past), a 7x7 depthwise conv, a 1x1 widening to 4n with a
    ReLU, a 1x1 back to n, plus x (no activation after the sum)."""

    def __init__(self, n: int):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(2 * n, 2 * n, 7, padding=3, groups=2 * n, bias=False),
            nn.Conv2d(2 * n, 4 * n, 1),
            nn.ReLU(inplace=True),
            nn.Conv2d(4 * n, n, 1, bias=False),
        )

    def forward(self, x: torch.Tensor, past: torch.Tensor | None = None, n: int = 1) -> torch.Tensor:
        """past=None: each frame's past is its predecessor in x, frames (N*T, ...) of n videos."""
        xp = CatPast.apply(x, n) if past is None else torch.cat([x, past], 1)
        return self.conv(xp) + x


# Blocks that see the previous frame: every path (parallel, published, streaming) feeds them alike.
MEMORY_BLOCKS = (MemBlock, SuperMemBlock)


class TPool(nn.Module):
    """Merge `stride` consecutive frames into one by a 1x1 conv over their stacked channels."""

    def __init__(self, n_f: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n_f * stride, n_f, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(frames_to_channels(x, self.stride))


class TGrow(nn.Module):
    """Split each frame into `stride` frames by a 1x1 conv to stride× channels."""

    def __init__(self, n_f: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(n_f, n_f * stride, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return channels_to_frames(self.conv(x), self.stride)


def apply_parallel(layers: nn.Sequential | list[nn.Module], x: torch.Tensor, n: int) -> torch.Tensor:
    """Apply layers to frames folded into the batch (N*T, C, H, W); MemBlocks see the previous frame,
    and nearest upsampling keeps the activations' dtype (frame_ops.upsample_nearest)."""
    for layer in layers:
        if isinstance(layer, MEMORY_BLOCKS):
            x = layer(x, n=n)
        elif (scale := _integer_nearest_scale(layer)) is not None:
            x = upsample_nearest(x, scale)
        else:
            x = layer(x)
    return x


def _integer_nearest_scale(layer: nn.Module) -> int | None:
    """The scale of a nearest-neighbour nn.Upsample by a whole number, else None."""
    if not (isinstance(layer, nn.Upsample) and layer.mode == "nearest"):
        return None
    scale = layer.scale_factor
    if isinstance(scale, (int, float)) and float(scale).is_integer():
        return int(scale)
    return None


def apply_published(layers: nn.Sequential | list[nn.Module], x: torch.Tensor, n: int) -> torch.Tensor:
    """The layers run as the author's code runs them, in the published order with its operators: a
    zero-filled shifted copy and a cat for each MemBlock, frames folded in and out of channels by a
    reshape (plus a copy back to channels_last). What the faster run must equal, and the baseline of
    benchmarks/memory_traffic.py."""
    for layer in layers:
        if isinstance(layer, MEMORY_BLOCKS):
            x = layer(x, shift_one_frame(x, n))
        elif isinstance(layer, TPool):
            _nt, c, h, w = x.shape
            x = layer.conv(same_layout(x.reshape(-1, layer.stride * c, h, w), x))
        elif isinstance(layer, TGrow):
            _nt, c, h, w = x.shape
            x = same_layout(layer.conv(x).reshape(-1, c, h, w), x)
        else:
            x = layer(x)
    return x


def run_order(layers: list[nn.Module]) -> list[nn.Module]:
    """The layers in the order they run: each TGrow before the nearest-neighbour Upsample it follows.

    A 1x1 conv and a channels-to-frames reshape act on each pixel alone, so they commute exactly with
    repeating pixels; run first, TGrow reads and writes a quarter of the pixels (forward and backward).
    Only the running order changes: the modules keep their published places and names.
    """
    out = list(layers)
    for i in range(len(out) - 1):
        up, grow = out[i], out[i + 1]
        if isinstance(up, nn.Upsample) and up.mode == "nearest" and isinstance(grow, TGrow):
            out[i], out[i + 1] = grow, up
    return out


def _per_frame(layers: list[nn.Module]) -> bool:
    """True when every layer acts on each frame alone (no memory of past frames, no frames merged)."""
    return not any(isinstance(layer, (*MEMORY_BLOCKS, TPool, TGrow)) for layer in layers)


def cache_custom_autograd_graphs() -> None:
    """Let AOTAutograd's cache keep graphs that hold a custom autograd.Function (CatPast, the pooled
    upsample gradient: 7 of the 9 stages).

    torch leaves it off by default (`autograd_cache_allow_custom_autograd_functions`), so those
    stages were traced forward and backward again in every process, cache or no cache: a warm first
    step took about 10 s on CPU instead of 5 (benchmarks/compile_cache.py). It is safe for these
    functions: Dynamo traces a Function's forward and backward into subgraphs of the stage's graph,
    and the cache key hashes them, so a changed backward compiles anew
    (tests/trainer/test_compile_cache.py checks it). A torch without the setting keeps its default.
    """
    if hasattr(functorch_config, "autograd_cache_allow_custom_autograd_functions"):
        functorch_config.autograd_cache_allow_custom_autograd_functions = True


class _Stage(nn.Module):
    """A run of layers that activation checkpointing recomputes as one piece (never registered as a
    submodule, so parameter names stay the published flat `encoder.N` / `decoder.N`)."""

    def __init__(self, layers: list[nn.Module], published: bool = False):
        super().__init__()
        self.layers = layers
        self.published = published

    def forward(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return apply_published(self.layers, x, n) if self.published else apply_parallel(self.layers, x, n)


class TAEHV(nn.Module):
    def __init__(
        self,
        latent_channels: int = 16,
        patch_size: int = 1,
        encoder_time_downscale: tuple[bool, bool, bool] = (True, True, False),
        decoder_time_upscale: tuple[bool, bool, bool] = (False, True, True),
        decoder_space_upscale: tuple[bool, bool, bool] = (True, True, True),
        activation_checkpointing: bool = False,
        super_decoder: bool = False,
        untrimmed_even_latents: bool = False,
        chunks: FrameChunks | None = None,
        family: str | None = None,
        preview: bool = False,
    ):
        """The knobs of the published class, plus a family's conventions (TAEHV.for_family sets them
        all from the family table). preview=True allows a decoder that upscales time less than the
        encoder downscales it: the author's cheaper previews, for decoding only."""
        super().__init__()
        if sum(encoder_time_downscale) != sum(decoder_time_upscale) and not (
            preview and sum(decoder_time_upscale) < sum(encoder_time_downscale)
        ):
            raise ValueError("encoder time downscale and decoder time upscale must match")
        self.family = family
        self.super_decoder = super_decoder
        self.untrimmed_even_latents = untrimmed_even_latents
        self.chunks = chunks
        self.latent_channels = latent_channels
        self.patch_size = patch_size
        self.t_downscale = 2 ** sum(encoder_time_downscale)
        self.t_upscale = 2 ** sum(decoder_time_upscale)
        # The decoder's first t_upscale-1 frames are warm-up (the causal convention: k latents
        # stand for 1 + t·(k-1) frames starting at frame 0); decode() drops them.
        self.frames_to_trim = self.t_upscale - 1
        self.activation_checkpointing = activation_checkpointing
        self.channels_last = False  # set by use_channels_last()
        p2 = patch_size**2
        self.encoder = nn.Sequential(
            conv(3 * p2, 64),
            nn.ReLU(inplace=True),
            TPool(64, 2 if encoder_time_downscale[0] else 1),
            conv(64, 64, stride=2, bias=False),
            MemBlock(64, 64),
            MemBlock(64, 64),
            MemBlock(64, 64),
            TPool(64, 2 if encoder_time_downscale[1] else 1),
            conv(64, 64, stride=2, bias=False),
            MemBlock(64, 64),
            MemBlock(64, 64),
            MemBlock(64, 64),
            TPool(64, 2 if encoder_time_downscale[2] else 1),
            conv(64, 64, stride=2, bias=False),
            MemBlock(64, 64),
            MemBlock(64, 64),
            MemBlock(64, 64),
            conv(64, latent_channels),
        )
        self.decoder = (
            self._super_decoder(latent_channels, p2, decoder_time_upscale, decoder_space_upscale)
            if super_decoder
            else self._base_decoder(latent_channels, p2, decoder_time_upscale, decoder_space_upscale)
        )
        self.init_weights()
        self._encoder_stages: list[_Stage] = []
        self._decoder_stages: list[_Stage] = []
        self._trim_before_last_stage = False
        self.use_published_order(False)

    @staticmethod
    def _base_decoder(latent_channels: int, p2: int, time_up: Strides, space_up: Strides) -> nn.Sequential:
        n_f = (256, 128, 64, 64)
        return nn.Sequential(
            Clamp(),
            conv(latent_channels, n_f[0]),
            nn.ReLU(inplace=True),
            MemBlock(n_f[0], n_f[0]),
            MemBlock(n_f[0], n_f[0]),
            MemBlock(n_f[0], n_f[0]),
            nn.Upsample(scale_factor=2 if space_up[0] else 1),
            TGrow(n_f[0], 2 if time_up[0] else 1),
            conv(n_f[0], n_f[1], bias=False),
            MemBlock(n_f[1], n_f[1]),
            MemBlock(n_f[1], n_f[1]),
            MemBlock(n_f[1], n_f[1]),
            nn.Upsample(scale_factor=2 if space_up[1] else 1),
            TGrow(n_f[1], 2 if time_up[1] else 1),
            conv(n_f[1], n_f[2], bias=False),
            MemBlock(n_f[2], n_f[2]),
            MemBlock(n_f[2], n_f[2]),
            MemBlock(n_f[2], n_f[2]),
            nn.Upsample(scale_factor=2 if space_up[2] else 1),
            TGrow(n_f[2], 2 if time_up[2] else 1),
            conv(n_f[2], n_f[3], bias=False),
            nn.ReLU(inplace=True),
            conv(n_f[3], 3 * p2),
        )

    @staticmethod
    def _super_decoder(latent_channels: int, p2: int, time_up: Strides, space_up: Strides) -> nn.Sequential:
        """No Clamp; a bias-free 1x1 to 512; per stage 3 SuperMemBlocks, a 3x3 conv to the next width
        times s², a ReLU, PixelShuffle(s) and the TGrow; the 3x3 head. About twice the base decoder."""
        layers: list[nn.Module] = [nn.Conv2d(latent_channels, 512, 1, bias=False)]
        for n, nxt, t_up, s_up in zip((512, 256, 128), (256, 128, 64), time_up, space_up):
            s = 2 if s_up else 1
            layers += [SuperMemBlock(n) for _ in range(3)]
            layers += [
                conv(n, nxt * s * s),
                nn.ReLU(inplace=True),
                nn.PixelShuffle(s),
                TGrow(nxt, 2 if t_up else 1),
            ]
        layers.append(conv(64, 3 * p2))
        return nn.Sequential(*layers)

    @classmethod
    def for_family(
        cls,
        name: str,
        activation_checkpointing: bool = False,
        decoder_time_upscale: Strides | None = None,
        decoder_space_upscale: Strides = (True, True, True),
    ) -> TAEHV:
        """The model of a published family (trainer/families.py), untrained. A decoder_time_upscale
        or decoder_space_upscale with strides switched off builds the author's cheaper preview."""
        fam = get_family(name)
        time_up = fam.decoder_time_upscale if decoder_time_upscale is None else decoder_time_upscale
        return cls(
            latent_channels=fam.latent_channels,
            patch_size=fam.patch_size,
            encoder_time_downscale=fam.encoder_time_downscale,
            decoder_time_upscale=time_up,
            decoder_space_upscale=decoder_space_upscale,
            activation_checkpointing=activation_checkpointing,
            super_decoder=fam.super_decoder,
            untrimmed_even_latents=fam.untrimmed_even_latents,
            chunks=fam.chunks,
            family=fam.name,
            preview=time_up != fam.decoder_time_upscale,
        )

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        family: str | None = None,
        decoder_time_upscale: Strides | None = None,
        decoder_space_upscale: Strides = (True, True, True),
    ) -> TAEHV:
        """A model of the weight file's family with its weights, loaded strictly. The family is
        `family` when given, else the one the file's metadata records (written at export), else the
        one its name says (the author's substring rules), else the one its tensors' shapes fit; a file
        that fits several is an error listing them."""
        path = Path(path)
        sd, meta = read_weights(path)
        name = family or meta.get("family") or family_from_name(path.name)
        if name is None:
            candidates = families_with_shapes(**shape_knobs(sd, path))
            if len(candidates) != 1:
                found = ", ".join(candidates) if candidates else "none"
                raise WeightsError(
                    f"{path}: cannot tell the family: no family in its metadata or name, and its shapes fit "
                    f"{'several' if candidates else 'no family'} ({found}); rename it to its family's name "
                    "(e.g. taew2_1.pth) or name the family"
                )
            name = candidates[0]
        try:
            model = cls.for_family(
                name, decoder_time_upscale=decoder_time_upscale, decoder_space_upscale=decoder_space_upscale
            )
        except FamilyError as err:
            raise WeightsError(f"{path}: {err}") from None
        load_state(model, sd, path, strict=True)
        return model

    @property
    def frame_quantum(self) -> int:
        """Clips are padded at the end to a multiple of this many frames."""
        return self.chunks.frames if self.chunks else self.t_downscale

    def kept_frames(self, k: int) -> slice | list[int]:
        """Which of the decoder's t_upscale·k frames for k latents decode() returns: all but the
        warm-up ones. H3 drops the first `lead` frames of each chunk; CogVideoX keeps all of an even
        number of latents' frames."""
        if self.chunks:
            period = self.chunks.frames + self.chunks.lead
            return [i for i in range(self.t_upscale * k) if i % period >= self.chunks.lead]
        if self.untrimmed_even_latents and k % 2 == 0:
            return slice(0, None)
        return slice(self.frames_to_trim, None)

    def init_weights(self) -> None:
        """An init under which the signal survives 40 convolutions from the first step.

        PyTorch's default conv init (uniform, fan-in, gain 1/sqrt(3)) shrinks activations at every
        ReLU layer: the decoder's first frames are flat (spatial std ~0.001) and training starts by
        climbing out of that. Kaiming fan-in for ReLU keeps the variance; zeroing each MemBlock's
        last conv makes every block start as the identity, so depth adds no noise until it learns
        something (as residual networks do). The output bias of 0.5 (the author's recipe) starts
        reconstructions at mid-grey.
        """
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        for m in self.modules():
            if isinstance(m, MEMORY_BLOCKS):
                last = m.conv[-1]
                assert isinstance(last, nn.Conv2d)  # conv(n_out, n_out); bias-free in SuperMemBlock
                nn.init.zeros_(last.weight)
                if last.bias is not None:
                    nn.init.zeros_(last.bias)
        # The output head starts at a tenth of Kaiming: at full scale the decoded frames start with
        # a spatial std of 2-6 around the 0.5 bias (training MSE 30+, measured at 64x64), and the
        # first steps only undo that; at 0.1 they start inside [0, 1] with their structure intact.
        head = self.decoder[-1]
        assert isinstance(head, nn.Conv2d) and head.bias is not None  # conv(n_f[3], 3 * p2)
        with torch.no_grad():
            head.weight.mul_(0.1)
        nn.init.constant_(head.bias, 0.5)

    @staticmethod
    def _split_stages(seq: nn.Sequential, published: bool = False) -> list[_Stage]:
        """Cut a sequence after each run of MemBlocks: the pieces activation checkpointing recomputes
        (and torch.compile compiles). published=True keeps the author's order and operators.

        Otherwise a last stage that only acts on each frame alone after a TGrow (Upsample, convs,
        ReLU) is cut off there, so that decode() can drop the warm-up frames before it.
        """
        stages: list[_Stage] = []
        current: list[nn.Module] = []
        layers = list(seq) if published else run_order(list(seq))
        for i, layer in enumerate(layers):
            current.append(layer)
            nxt = layers[i + 1] if i + 1 < len(layers) else None
            if isinstance(layer, MEMORY_BLOCKS) and not isinstance(nxt, MEMORY_BLOCKS):
                stages.append(_Stage(current, published))
                current = []
        grows = [i for i, layer in enumerate(current) if isinstance(layer, TGrow)]
        if not published and grows and grows[-1] + 1 < len(current) and _per_frame(current[grows[-1] + 1 :]):
            stages.append(_Stage(current[: grows[-1] + 1]))
            current = current[grows[-1] + 1 :]
        if current:
            stages.append(_Stage(current, published))
        return stages

    def use_published_order(self, published: bool = True) -> TAEHV:
        """Run the layers as the author's code does (True), or reordered and with fewer copies
        (False, the default): the same outputs to float rounding. For parity tests and the baseline
        of benchmarks/memory_traffic.py."""
        self._encoder_stages = self._split_stages(self.encoder, published)
        self._decoder_stages = self._split_stages(self.decoder, published)
        stages = self._decoder_stages
        # decode() drops the warm-up frames before a last stage that only acts on each frame alone
        self._trim_before_last_stage = (
            len(stages) > 1 and isinstance(stages[-2].layers[-1], TGrow) and _per_frame(stages[-1].layers)
        )
        return self

    def use_channels_last(self) -> TAEHV:
        """NHWC activations: faster convolutions on tensor-core GPUs, same results.

        Only the activations change layout. A convolution whose input is channels_last runs
        channels_last whatever its weight's layout, and the weights must stay contiguous: DeepSpeed
        views every parameter as flat bytes (its initial broadcast, ZeRO's flat buffers), which an
        NHWC weight cannot give ("self.stride(-1) must be 1 to view Float as Byte").
        """
        self.channels_last = True
        return self

    def compile_stages(self, **kwargs: Any) -> TAEHV:
        """torch.compile each encoder and decoder stage (kwargs go to torch.compile; dynamic=False
        unless given), so forward, encode and decode (on teacher latents too) all run compiled.

        Per stage rather than the whole forward: each stage is one graph with no break (tests/trainer/
        test_compile.py), the stages are what activation checkpointing recomputes, and decode() on its
        own reuses the decoder's compiled stages. The weights and their names are untouched. Call it
        after use_channels_last() / use_published_order() (the latter rebuilds the stages).
        """
        kwargs.setdefault("dynamic", False)
        stages = self._encoder_stages + self._decoder_stages
        # Dynamo keeps its graphs per code object, and every stage runs _Stage.forward: 9 stages, each
        # with and without grad and at each clip size. Past the default limit (8 graphs) the rest would
        # silently run eager; 8 per stage leaves room for a few sizes.
        limit = 8 * len(stages)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)
        cache_custom_autograd_graphs()
        for stage in stages:
            stage.compile(**kwargs)
        return self

    def _run(self, stages: list[_Stage], x: torch.Tensor, n: int) -> torch.Tensor:
        for stage in stages:
            if self.activation_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(stage, x, n, use_reentrant=False)
            else:
                x = stage(x, n)
        return x

    def pad_frames(self, x: torch.Tensor) -> torch.Tensor:
        """Pad N×T×C×H×W at the end, repeating the last frame, to a multiple of frame_quantum (the
        time downscale, or H3's chunk)."""
        q = self.frame_quantum
        rem = x.shape[1] % q
        if rem:
            x = torch.cat([x, x[:, -1:].expand(-1, q - rem, -1, -1, -1)], 1)
        return x

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """N×T×3×H×W in [0, 1] -> N×(T/4)×latent×(H/8)×(W/8) (8·patch in space; LTX: T/8; H3: 5 per
        17 frames, less 3)."""
        x = self.pad_frames(x)
        if self.chunks:  # each chunk a video of its own, behind its zero frames: memory resets
            c = self.chunks
            n, t = x.shape[:2]
            parts = x.reshape(n * (t // c.frames), c.frames, *x.shape[2:])
            lead = parts.new_zeros(parts.shape[0], c.lead, *parts.shape[2:])
            z = self._encode(torch.cat([lead, parts], 1))
            return z.reshape(n, -1, *z.shape[2:])[:, : -c.dropped_latents]
        return self._encode(x)

    def _encode(self, x: torch.Tensor) -> torch.Tensor:
        n, t = x.shape[:2]
        flat = x.reshape(n * t, *x.shape[2:])
        if self.patch_size > 1:
            flat = F.pixel_unshuffle(flat, self.patch_size)
        if self.channels_last:
            flat = flat.contiguous(memory_format=torch.channels_last)
        z = self._run(self._encoder_stages, flat, n)
        return z.reshape(n, z.shape[0] // n, *z.shape[1:])

    def decode(self, z: torch.Tensor, trim: bool = True, clamp: bool = True) -> torch.Tensor:
        """N×K×latent×h×w -> N×(4K−3)×3×8h×8w in [0, 1] (the first 3 warm-up frames dropped; other
        families by their rule, kept_frames).

        clamp=False is for the training loss: the clamp to [0, 1] has zero gradient outside, so a
        pixel that overshoots would never be pulled back by the loss.
        """
        n, k = z.shape[:2]
        flat = z.reshape(n * k, *z.shape[2:])
        if self.channels_last:
            flat = flat.contiguous(memory_format=torch.channels_last)
        stages = self._decoder_stages
        kept = self.kept_frames(k)
        early = trim and self._trim_before_last_stage
        if early:  # the last stage's work on the warm-up frames would only be thrown away
            x = self._run(stages[:-1], flat, n)
            x = (
                drop_leading_frames(x, n, kept.start or 0)
                if isinstance(kept, slice)
                else keep_frames(x, n, kept)
            )
            x = self._run(stages[-1:], x, n)
        else:
            x = self._run(stages, flat, n)
        if self.patch_size > 1:
            x = F.pixel_shuffle(x, self.patch_size)
        if clamp:
            x = x.clamp(0, 1)
        x = x.reshape(n, x.shape[0] // n, *x.shape[1:])
        return x[:, kept] if trim and not early else x

    def forward(self, x: torch.Tensor, clamp: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        z = self.encode(x)
        return z, self.decode(z, clamp=clamp)


def reconstruction_target(video: torch.Tensor, n_decoded: int) -> torch.Tensor:
    """The input frames a decoded clip is compared with, in training and validation alike.

    decode(encode(x)) of T = 4k frames returns 4k−3 frames which stand for input frames
    [0, 4k−3): the causal convention of the teacher (HunyuanVideo) the published weights were
    distilled from, where k latents decode to 1 + 4(k−1) frames starting at frame 0.
    """
    return video[:, :n_decoded]


def build_model(model_cfg: ModelSection) -> TAEHV:
    """A TAEHV from the `[model]` section of the run config (trainer.config.ModelSection): its
    family's model, or for `custom` the knobs as written."""
    if model_cfg.family in FAMILIES:
        model = TAEHV.for_family(
            model_cfg.family, activation_checkpointing=model_cfg.activation_checkpointing
        )
    else:
        model = TAEHV(
            latent_channels=model_cfg.latent_channels,
            patch_size=model_cfg.patch_size,
            encoder_time_downscale=model_cfg.encoder_time_downscale,
            decoder_time_upscale=model_cfg.decoder_time_upscale,
            decoder_space_upscale=model_cfg.decoder_space_upscale,
            activation_checkpointing=model_cfg.activation_checkpointing,
        )
    if model_cfg.init_weights:
        load_weights(model, model_cfg.init_weights, strict=model_cfg.init_strict)
    if model_cfg.channels_last:
        model.use_channels_last()
    return model


def read_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """A weight file's state dict and its metadata (a .safetensors file's header; {} for .pth)."""
    path = Path(path)
    if not path.is_file():
        raise WeightsError(f"{path}: no such weights file")
    meta: dict[str, str] = {}
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open
            from safetensors.torch import load_file

            with safe_open(str(path), framework="pt") as f:
                meta = dict(f.metadata() or {})
            return load_file(str(path)), meta
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any decoder failure is a user-facing file problem
        raise WeightsError(f"{path}: cannot read weights ({type(err).__name__}: {err})") from None
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        raise WeightsError(f"{path}: expected a state dict, found {type(sd).__name__}")
    return sd, meta


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    return read_weights(path)[0]


def _time_stride(sd: dict[str, torch.Tensor], key: str, path: Path, grow: bool) -> bool:
    shape = tuple(sd[key].shape)  # TPool: (n, n·stride, 1, 1); TGrow: (n·stride, n, 1, 1)
    stride = shape[0] // shape[1] if grow else shape[1] // shape[0]
    if stride not in (1, 2):
        raise WeightsError(f"{path}: {key} has shape {shape}: not a TAEHV time stride of 1 or 2")
    return stride == 2


def shape_knobs(sd: dict[str, torch.Tensor], path: Path) -> dict[str, object]:
    """The shape knobs (and the decoder kind) a TAEHV state dict implies: latent width, patch size,
    time strides. The super decoder opens with a bias-free 1x1 conv (decoder.0), the base one with a
    parameter-free Clamp."""
    wide = "decoder.0.weight" in sd
    grows = (7, 14, 21) if wide else (7, 13, 19)
    needed = ["encoder.0.weight", "encoder.17.weight"] + [f"encoder.{i}.conv.weight" for i in (2, 7, 12)]
    needed += [f"decoder.{i}.conv.weight" for i in grows]
    missing = [k for k in needed if k not in sd]
    if missing:
        some = ", ".join(sorted(sd)[:5]) or "none"
        raise WeightsError(f"{path}: not TAEHV weights: no {missing[0]} (its keys begin: {some})")
    return {
        "latent_channels": int(sd["encoder.17.weight"].shape[0]),
        "patch_size": math.isqrt(sd["encoder.0.weight"].shape[1] // 3),
        "encoder_time_downscale": tuple(
            _time_stride(sd, f"encoder.{i}.conv.weight", path, False) for i in (2, 7, 12)
        ),
        "decoder_time_upscale": tuple(
            _time_stride(sd, f"decoder.{i}.conv.weight", path, True) for i in grows
        ),
        "super_decoder": wide,
    }


def load_weights(model: nn.Module, path: str | Path, strict: bool = True) -> None:
    load_state(model, read_state_dict(path), path, strict)


def load_state(model: nn.Module, sd: dict[str, torch.Tensor], path: str | Path, strict: bool = True) -> None:
    """Load a state dict read from `path` into `model`, naming any mismatch. A TGrow the file holds
    with more frames than the model's (time upscaling switched off for a preview) keeps its
    last-timestep channels, as the author's class does."""
    own = model.state_dict()
    sd = dict(sd)
    for name, module in model.named_modules():
        key = f"{name}.conv.weight"
        if isinstance(module, TGrow) and key in sd and key in own:
            have, want = sd[key].shape[0], own[key].shape[0]
            if have > want and have % want == 0:
                sd[key] = sd[key][-want:]
    missing = sorted(set(own) - set(sd))
    unexpected = sorted(set(sd) - set(own))
    wrong_shape = sorted(k for k in set(own) & set(sd) if tuple(own[k].shape) != tuple(sd[k].shape))
    if wrong_shape:
        shown = ", ".join(f"{k} {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}" for k in wrong_shape[:8])
        raise WeightsError(f"{path}: {len(wrong_shape)} tensor(s) with the wrong shape: {shown}")
    if strict and (missing or unexpected):

        def _list(keys: list[str]) -> str:
            return ", ".join(keys[:12]) + (f" ... (+{len(keys) - 12})" if len(keys) > 12 else "")

        parts = [f"{path}: does not match the model"]
        if missing:
            parts.append(f"missing {len(missing)} key(s): {_list(missing)}")
        if unexpected:
            parts.append(f"unexpected {len(unexpected)} key(s): {_list(unexpected)}")
        parts.append("(set model.init_strict = false to load the matching keys only)")
        raise WeightsError("; ".join(parts))
    model.load_state_dict({k: v for k, v in sd.items() if k in own}, strict=False)
