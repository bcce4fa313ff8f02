"""A run's reconstruction samples, as validation writes them (`RUN/samples/step-<N>/`, see
docs/design.md): which steps are complete, one step's index, the newest one's paths. Read by the
TUI's Samples view, `--no-tui` and `status`; a step directory without index.json is still being
written and does not exist here."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from taehv_console.core.toml_compat import tomllib

SAMPLES_DIR = "samples"
INDEX = "index.json"
_STEP_DIR = re.compile(r"step-(\d+)")


class SamplesError(ValueError):
    """A step's index.json that cannot be used; the message names the file and what is wrong."""


@dataclass(frozen=True)
class SampleClip:
    index: int  # position in the fixed sample set: the same clip at every validation
    source: str  # the video it was cut from
    psnr: float | None  # None when validation's PSNR was not finite
    png: Path  # the strip: input frames, reconstruction, error × amplify
    video: Path | None  # side-by-side input | reconstruction, when written
    frames: int | None = None
    height: int | None = None
    width: int | None = None

    @property
    def psnr_text(self) -> str:
        return f"{self.psnr:.2f} dB" if self.psnr is not None else "not finite"


@dataclass(frozen=True)
class SampleStep:
    step: int
    path: Path  # RUN/samples/step-<N>
    amplify: float | None
    clips: tuple[SampleClip, ...]

    def clip(self, index: int) -> SampleClip | None:
        return next((c for c in self.clips if c.index == index), None)

    def paths(self) -> tuple[Path, ...]:
        """Every file of this step a person would open: each clip's PNG, then its video."""
        out: list[Path] = []
        for c in self.clips:
            out += [c.png] + ([c.video] if c.video is not None else [])
        return tuple(out)

    def to_dict(self) -> dict[str, object]:
        return {
            "step": self.step,
            "dir": str(self.path),
            "amplify": self.amplify,
            "clips": [
                {
                    "index": c.index,
                    "source": c.source,
                    "psnr": c.psnr,
                    "png": str(c.png),
                    "video": str(c.video) if c.video is not None else None,
                }
                for c in self.clips
            ],
        }


def samples_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / SAMPLES_DIR


def list_sample_steps(run_dir: str | Path) -> tuple[int, ...]:
    """The steps whose samples are complete (index.json written), newest first; () when none."""
    try:
        entries = list(samples_dir(run_dir).iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return ()
    steps = []
    for entry in entries:
        m = _STEP_DIR.fullmatch(entry.name)
        if m is not None and (entry / INDEX).is_file():
            steps.append(int(m.group(1)))
    return tuple(sorted(steps, reverse=True))


def _member(step_dir: Path, name: object, where: str) -> Path:
    """A file named by index.json, which must sit in the step's own directory."""
    if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
        raise SamplesError(f"{where}: expected a file name in {step_dir}, got {name!r}")
    return step_dir / name


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def load_sample_step(run_dir: str | Path, step: int) -> SampleStep:
    """One complete step's index. SamplesError names the file when it is missing or malformed."""
    step_dir = samples_dir(run_dir) / f"step-{step}"
    index_path = step_dir / INDEX
    try:
        raw = json.loads(index_path.read_text())
    except FileNotFoundError:
        raise SamplesError(f"{index_path}: no such file (the step's samples are not complete)") from None
    except (OSError, ValueError) as err:  # ValueError: not UTF-8, not JSON, an integer too long
        raise SamplesError(f"{index_path}: cannot read it: {err}") from None
    except RecursionError:
        raise SamplesError(f"{index_path}: cannot read it: nested too deeply") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("clips"), list):
        raise SamplesError(f"{index_path}: expected an object with a 'clips' list")
    clips = []
    for i, c in enumerate(raw["clips"]):
        where = f"{index_path}: clips[{i}]"
        if not isinstance(c, dict) or _count(c.get("index")) is None:
            raise SamplesError(f"{where}: expected an object with an integer 'index'")
        video = c.get("video")
        clips.append(
            SampleClip(
                index=int(c["index"]),
                source=str(c.get("source", "")),
                psnr=_number(c.get("psnr")),
                png=_member(step_dir, c.get("png"), f"{where}.png"),
                video=_member(step_dir, video, f"{where}.video") if video is not None else None,
                frames=_count(c.get("frames")),
                height=_count(c.get("height")),
                width=_count(c.get("width")),
            )
        )
    if _count(raw.get("step")) not in (None, step):
        raise SamplesError(f"{index_path}: says step {raw['step']}, but sits in step-{step}/")
    return SampleStep(
        step=step,
        path=step_dir,
        amplify=_number(raw.get("amplify")),
        clips=tuple(sorted(clips, key=lambda c: c.index)),
    )


def newest_samples(run_dir: str | Path) -> SampleStep | None:
    """The newest complete step whose index loads (a broken newer one is passed over), or None."""
    for step in list_sample_steps(run_dir):
        try:
            return load_sample_step(run_dir, step)
        except SamplesError:
            continue
    return None


def validation_every(run_dir: str | Path) -> int | None:
    """The run's schedule.val_every from its run.toml (samples appear at each validation), or None
    when the file or the value is not there."""
    try:
        raw = tomllib.loads((Path(run_dir) / "run.toml").read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    schedule = raw.get("schedule")
    every = schedule.get("val_every") if isinstance(schedule, dict) else None
    return every if isinstance(every, int) and not isinstance(every, bool) and every > 0 else None
