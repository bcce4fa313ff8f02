"""The TAE families the author publishes, one entry each: the shapes a family's student has, how its
frames line up with its latents, its teacher's diffusers class and the name its weights go by.

A new family is one entry in FAMILIES. Facts from docs/reference/FACTS.md ("The TAE families").
Imports no torch: the config schema and the console read it.
"""

from __future__ import annotations

from dataclasses import dataclass

Strides = tuple[bool, bool, bool]


@dataclass(frozen=True)
class FrameChunks:
    """A chunked encoder (MiniMax H3): the clip is padded to whole chunks of `frames` by repeating
    its last frame; each chunk gets `lead` zero frames in front and is encoded alone (memory starts
    empty); the clip's last `dropped_latents` latents are dropped. Decoding runs over all latents with
    memory carried across and drops the first `lead` frames of each (frames + lead)-frame chunk."""

    frames: int = 17
    lead: int = 3
    dropped_latents: int = 3


@dataclass(frozen=True)
class Family:
    name: str
    serves: str  # the video model(s) whose latent space it shares
    latent_channels: int
    patch_size: int
    encoder_time_downscale: Strides
    decoder_time_upscale: Strides
    teacher_class: str  # the teacher VAE's diffusers class
    super_decoder: bool = False  # the wider SuperMemBlock decoder (names with `_super`)
    # CogVideoX: an even number of latents decodes with nothing dropped (the author's alignment for
    # clips of 4k frames); every other family drops the decoder's first t_upscale - 1 frames
    untrimmed_even_latents: bool = False
    chunks: FrameChunks | None = None

    @property
    def export_name(self) -> str:
        """The weight file's stem: the author's class picks the shapes from this name alone."""
        return self.name

    @property
    def space_scale(self) -> int:
        return 8 * self.patch_size

    @property
    def time_scale(self) -> int:
        return 2 ** sum(self.encoder_time_downscale)

    def shape_knobs(self) -> dict[str, object]:
        """The run config's `[model]` keys this family fixes."""
        return {
            "latent_channels": self.latent_channels,
            "patch_size": self.patch_size,
            "encoder_time_downscale": self.encoder_time_downscale,
            "decoder_time_upscale": self.decoder_time_upscale,
        }


_T4 = ((True, True, False), (False, True, True))  # 4x time: encoder strides, decoder strides
_T8 = ((True, True, True), (True, True, True))

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("taehv", "HunyuanVideo 1", 16, 1, *_T4, "AutoencoderKLHunyuanVideo"),
        Family("taew2_1", "Wan 2.1, Wan 2.2 14B, Qwen-Image", 16, 1, *_T4, "AutoencoderKLWan"),
        Family("taew2_2", "Wan 2.2 TI2V 5B", 48, 2, *_T4, "AutoencoderKLWan"),
        Family("taew2_2_super", "Wan 2.2 TI2V 5B", 48, 2, *_T4, "AutoencoderKLWan", super_decoder=True),
        Family("taehv1_5", "HunyuanVideo 1.5", 32, 2, *_T4, "AutoencoderKLHunyuanVideo15"),
        Family(
            "taehv1_5_super",
            "HunyuanVideo 1.5",
            32,
            2,
            *_T4,
            "AutoencoderKLHunyuanVideo15",
            super_decoder=True,
        ),
        Family("taecvx", "CogVideoX", 16, 1, *_T4, "AutoencoderKLCogVideoX", untrimmed_even_latents=True),
        Family("taeltx_2", "LTX-2", 128, 4, *_T8, "AutoencoderKLLTX2Video"),
        Family("taeltx2_3", "LTX-2.3", 128, 4, *_T8, "AutoencoderKLLTX2Video"),
        Family("taeh3", "MiniMax H3", 24, 2, *_T4, "AutoencoderKLMiniMaxH3", chunks=FrameChunks()),
    )
}
DEFAULT_FAMILY = "taehv"
# A run config's family for shapes no family has (knobs set by hand, as before families existed): the
# model takes the knobs as written, with taehv's conventions and export name.
CUSTOM = "custom"


def export_stem(family: str) -> str:
    """The stem of a run's exported weight files: the family's name (taehv for `custom` shapes, the
    name the exports always had)."""
    return FAMILIES[family].export_name if family in FAMILIES else DEFAULT_FAMILY


def exported_files(family: str) -> tuple[str, str]:
    """(weights, EMA weights) as final/ and best/ hold them: `<family>.safetensors` and
    `<family>_ema.safetensors`, each with a `.pth` of the same stem beside it (the author's class
    reads only torch.load files)."""
    stem = export_stem(family)
    return f"{stem}.safetensors", f"{stem}_ema.safetensors"


def all_exported_files() -> tuple[str, ...]:
    """Every name final/ and best/ may hold weights under, EMA first (a folder whose run.toml is
    unknown is searched for these)."""
    names = [exported_files(f) for f in FAMILIES]
    return tuple(ema for _, ema in names) + tuple(w for w, _ in names)


@dataclass(frozen=True)
class ClipRule:
    """The clip lengths and crop sizes a student encodes exactly: frames in whole `frame_quantum`s
    (4 or 8 latents' worth of time, or H3's 17-frame chunks), crops in whole `space_scale` pixels
    (8 x patch). Anything else would be padded, and the padding would be trained on."""

    family: str
    frame_quantum: int
    time_scale: int
    space_scale: int
    chunked: bool = False

    def frames_problem(self, frames: int) -> str | None:
        """None when a `frames`-frame clip fits; else what is wrong, with the nearest lengths that fit."""
        q = self.frame_quantum
        if frames >= q and frames % q == 0:
            return None
        below, above = frames // q * q, (frames // q + 1) * q
        nearest = " or ".join(str(n) for n in (below, above) if n >= q)
        why = (
            f"{self.family} encodes {q}-frame chunks"
            if self.chunked
            else f"{self.family}'s encoder downscales time {self.time_scale}x"
        )
        return f"must be a multiple of {q} ({why}), got {frames}; the nearest lengths that work: {nearest}"

    def size_problem(self, pixels: int) -> str | None:
        """None when a crop side of `pixels` fits; else what is wrong, naming the family's 8·p."""
        s = self.space_scale
        if pixels >= s and pixels % s == 0:
            return None
        nearest = " or ".join(str(n) for n in (pixels // s * s, (pixels // s + 1) * s) if n >= s)
        patch = f": 8 x patch {s // 8}" if s > 8 else ""
        return (
            f"must be a multiple of {s} ({self.family}'s encoder downscales space {s}x{patch}), "
            f"got {pixels}; the nearest that work: {nearest}"
        )


def clip_rule(
    family: str, encoder_time_downscale: Strides | None = None, patch_size: int | None = None
) -> ClipRule:
    """The rule for a family's clips; for `custom` shapes, from the knobs (taehv's conventions)."""
    fam = FAMILIES.get(family)
    if fam is not None:
        q = fam.chunks.frames if fam.chunks else fam.time_scale
        return ClipRule(family, q, fam.time_scale, fam.space_scale, chunked=fam.chunks is not None)
    t = 2 ** sum(encoder_time_downscale or FAMILIES[DEFAULT_FAMILY].encoder_time_downscale)
    return ClipRule(family, t, t, 8 * (patch_size or 1))


def teacher_frames(family: str, frames: int, time_scale: int | None = None) -> int:
    """How many leading frames of a `frames`-frame clip the family's teacher encodes, so that its
    latents are as many as the student's and latent j of each stands for the same frames.

    A causal 1 + t·k VAE (t = 4; LTX t = 8): the student's k latents of T = t·k frames match the
    teacher's encode of frames [0, T - (t - 1)) = 1 + t·(k - 1) frames. H3's teacher chunks the clip as
    the student does (17-frame chunks, 3 zero frames in front, the last 3 latents dropped), so it
    encodes all T = 17·n frames into the same 5n - 3 latents. Either way the student's decode stands
    for input frames [0, n_decoded): T - (t - 1), H3 T - 12, CogVideoX's even latent counts all T.

    CogVideoX at an even latent count k: diffusers' AutoencoderKLCogVideoX encodes 8m frames evenly
    (two latents per 8-frame batch, each standing for 4 frames, no lone first frame) and 8m + 1
    causally; its decode of an even number of latents gives 4k frames, of an odd number 1 + 4(k - 1).
    The author's taecvx keeps all 4k decoded frames of an even k: those stand for input frames [0, T)
    only when the teacher encoded all T = 8m. An odd k (T = 8m + 4) is the causal case, T - 3."""
    fam = FAMILIES.get(family)
    if fam is not None and fam.chunks is not None:
        return frames
    if fam is not None and fam.untrimmed_even_latents and (frames // fam.time_scale) % 2 == 0:
        return frames
    t = fam.time_scale if fam is not None else (time_scale or 4)
    return frames - (t - 1)


class FamilyError(ValueError):
    """A family name that is not in the table, or a file whose family cannot be told."""


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise FamilyError(f"unknown family {name!r}; known: {', '.join(FAMILIES)}") from None


# The author's class tests the path for these substrings in this order (taecvx first, so its trim
# wins; a bare taehv-shaped name falls through to the default); `_super` then picks the wide decoder.
# taew2_1 and taehv have no rule of their own there (the default shapes): named here so that an
# exported file says its family exactly.
_NAME_RULES: tuple[tuple[str, str], ...] = (
    ("taecvx", "taecvx"),
    ("taeh3", "taeh3"),
    ("taew2_2", "taew2_2"),
    ("taehv1_5", "taehv1_5"),
    ("taeltx2_3", "taeltx2_3"),
    ("taeltx", "taeltx_2"),
    ("taew2_1", "taew2_1"),
    ("taehv", "taehv"),
)


def family_from_name(file_name: str) -> str | None:
    """The family a weight file's name says, by the author's substring order; None when it says none."""
    for needle, family in _NAME_RULES:
        if needle in file_name:
            if "_super" in file_name:
                wide = f"{family}_super"
                return wide if wide in FAMILIES else None
            return family
    return None


def families_with_shapes(**knobs: object) -> list[str]:
    """Families whose shape knobs equal every given one (table order), and the decoder kind when given."""
    wide = knobs.pop("super_decoder", None)
    out = []
    for fam in FAMILIES.values():
        own = fam.shape_knobs()
        if all(own[k] == v for k, v in knobs.items()) and (wide is None or wide == fam.super_decoder):
            out.append(fam.name)
    return out
