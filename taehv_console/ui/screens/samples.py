"""Samples: what the model learned, as validation drew it. The newest step's strip of one clip
(rows: input frames, reconstruction, error amplified), clip and step switched by key, and the
same clip at the previous validation beside it to compare. Drawn with textual-image: Kitty
graphics or Sixel where the terminal has them, half-blocks elsewhere (tmux included). A thread
worker lists the run's samples every second and reads the strips; the screen only draws."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from PIL import Image as PILImageModule
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.content import Content
from textual.widget import Widget
from textual.widgets import Footer, Static
from textual.worker import get_current_worker

from taehv_console.core.watch.samples import (
    SamplesError,
    SampleStep,
    list_sample_steps,
    load_sample_step,
    validation_every,
)
from taehv_console.ui.images import IMAGE_WIDGETS
from taehv_console.ui.messages import SampleImagesRead, SamplesListed
from taehv_console.ui.screens.base import ConsoleScreen

if TYPE_CHECKING:
    from textual import getters

    from taehv_console.core.watch.samples import SampleClip
    from taehv_console.ui.apptype import ConsoleApp

POLL_S = 1.0


def clip_label(step: SampleStep, clip: SampleClip, what: str, versus: SampleClip | None = None) -> Content:
    parts: list[str | Content] = [
        Content.styled(f"step {step.step}", "bold"),
        Content.styled(f" {what}" if what else "", "dim"),
        f"  clip {clip.index}  PSNR ",
        Content.styled(clip.psnr_text, "bold $accent"),
    ]
    if versus is not None and clip.psnr is not None and versus.psnr is not None:
        parts.append(Content.styled(f" ({clip.psnr - versus.psnr:+.2f} dB)", "dim"))
    parts.append(Content.styled(f"  {Path(clip.source).name}", "dim"))
    return Content.assemble(*parts)


def empty_text(run_dir: str | None, val_every: int | None) -> Content:
    if run_dir is None:
        return Content.styled("No run here: attach to one (a) or start one (s) to see its samples.", "dim")
    when = f"every {val_every} steps (schedule.val_every)" if val_every else "every schedule.val_every steps"
    return Content.assemble(
        Content.styled("No samples yet.", "bold"),
        f"\nValidation writes them at each validation, {when}: for up to 4 fixed clips, the input, "
        "the reconstruction and the error amplified, in ",
        Content.styled(str(Path(run_dir) / "samples" / "step-<N>"), "$accent"),
        ". They show here as soon as the first one is complete.",
    )


class SamplesScreen(ConsoleScreen):
    if TYPE_CHECKING:
        app = getters.app(ConsoleApp)

    CSS_PATH = "samples.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back", id="back", tooltip="Back to the dashboard"),
        Binding("right", "clip(1)", "Next clip", id="next-clip", key_display="→", tooltip="The next clip"),
        Binding(
            "left", "clip(-1)", "Previous clip", id="previous-clip", show=False, tooltip="The previous clip"
        ),
        Binding(
            "down", "step(1)", "Older", id="older-step", key_display="↓", tooltip="An earlier validation"
        ),
        Binding("up", "step(-1)", "Newer", id="newer-step", key_display="↑", tooltip="A later validation"),
        Binding(
            "c",
            "toggle_compare",
            "Compare",
            id="compare-samples",
            tooltip="Show the same clip at the previous validation below, with both PSNRs",
        ),
    ]

    def __init__(self, run_dir: str | None, images: str = "auto") -> None:
        """`run_dir`: the run whose samples to show (None: no run); `images`: a key of
        IMAGE_WIDGETS (the settings file's `images`)."""
        super().__init__()
        self.run_dir = run_dir
        self.image_widget = IMAGE_WIDGETS.get(images, IMAGE_WIDGETS["auto"])
        self.steps: tuple[SampleStep, ...] = ()
        self.val_every: int | None = None
        self.step_at = 0  # index into steps: 0 is the newest (followed as new ones come)
        self.clip_at = 0
        self.compare = False
        self._images: dict[str, PILImageModule.Image | str] = {}
        self._listed = False

    def compose(self) -> ComposeResult:
        yield Static("", id="samples-title")
        with Vertical(id="samples-body"):
            # each strip in a box of its own: an image sized `auto` fits the box it sits in
            yield Static("", id="current-label", classes="strip-label")
            with Vertical(id="current-box", classes="strip-box"):
                yield self.image_widget(id="current-strip", classes="strip")
            yield Static("", id="previous-label", classes="strip-label")
            with Vertical(id="previous-box", classes="strip-box"):
                yield self.image_widget(id="previous-strip", classes="strip")
            yield Static("", id="samples-legend")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#samples-title", Static).update(Content.styled("reading samples …", "dim"))
        self._draw()
        if self.run_dir is not None:
            self._watch(self.run_dir)

    # ---------------------------------------------------------------- reading (thread workers)
    @work(thread=True, exclusive=True, group="samples-list", exit_on_error=False)
    def _watch(self, run_dir: str) -> None:
        worker = get_current_worker()
        known: dict[int, SampleStep] = {}
        shown: tuple[int, ...] | None = None
        val_every = validation_every(run_dir)
        while not worker.is_cancelled:
            listed = list_sample_steps(run_dir)
            if listed != shown:
                shown = listed
                for step in listed:
                    if step not in known:
                        try:
                            known[step] = load_sample_step(run_dir, step)
                        except SamplesError:
                            continue  # a broken index is passed over; the next listing tries again
                known = {s: known[s] for s in listed if s in known}  # a step written again reloads
                steps = tuple(known.values())
                if len(steps) < len(listed):
                    shown = None
                self.post_message(SamplesListed(steps, val_every))
            deadline = time.monotonic() + POLL_S
            while time.monotonic() < deadline:
                if worker.is_cancelled:
                    return
                time.sleep(0.05)

    @work(thread=True, exclusive=True, group="samples-read", exit_on_error=False)
    def _read(self, paths: tuple[str, ...]) -> None:
        out: dict[str, PILImageModule.Image | str] = {}
        for path in paths:
            try:
                with PILImageModule.open(path) as im:
                    out[path] = im.convert("RGB")
            except (OSError, ValueError) as err:
                out[path] = f"cannot read {path}: {err}"
        self.post_message(SampleImagesRead(out))

    def on_samples_listed(self, message: SamplesListed) -> None:
        current = self.steps[self.step_at].step if self.steps and self.step_at > 0 else None
        self.steps, self.val_every, self._listed = message.steps, message.val_every, True
        # a step validation wrote again (a resumed run redoing it) vanished from the listing first:
        # its old strips are not shown for the new ones
        kept = {str(c.png) for step in self.steps for c in step.clips}
        self._images = {path: image for path, image in self._images.items() if path in kept}
        # the newest is followed; an older step the user chose stays chosen as new ones arrive
        found = [i for i, s in enumerate(self.steps) if s.step == current]
        self.step_at = found[0] if found else 0
        self._draw()

    def on_sample_images_read(self, message: SampleImagesRead) -> None:
        self._images.update(message.images)
        for old in list(self._images)[: max(0, len(self._images) - 16)]:
            del self._images[old]  # the 16 read last are kept: switching back is instant
        self._draw()

    # ---------------------------------------------------------------- drawing
    def _selection(self) -> tuple[SampleStep, SampleClip, SampleStep | None, SampleClip | None] | None:
        if not self.steps:
            return None
        step = self.steps[self.step_at]
        clips = step.clips
        if not clips:
            return None
        clip = clips[self.clip_at % len(clips)]
        older = self.steps[self.step_at + 1] if self.step_at + 1 < len(self.steps) else None
        before = older.clip(clip.index) if older is not None else None
        return step, clip, older, before

    def _draw(self) -> None:
        title = self.query_one("#samples-title", Static)
        body = self.query_one("#samples-body")
        chosen = self._selection()
        if chosen is None:
            body.display = False
            title.update(
                empty_text(self.run_dir, self.val_every)
                if self._listed or self.run_dir is None
                else Content.styled("reading samples …", "dim")
            )
            return
        body.display = True
        step, clip, older, before = chosen
        n = len(step.clips)
        title.update(
            Content.assemble(
                Content.styled("samples ", "bold"),
                f"step {step.step}",
                Content.styled(
                    f" ({'newest' if self.step_at == 0 else f'{self.step_at} older than the newest'}"
                    f" of {len(self.steps)} validations)",
                    "dim",
                ),
                f"  clip {clip.index}",
                Content.styled(f" ({self.clip_at % n + 1} of {n})", "dim"),
                Content.styled("  compare: on" if self.compare else "", "bold"),
            )
        )
        wanted = [str(clip.png)]
        self._show("current", clip.png, clip_label(step, clip, "", before if self.compare else None))
        compare = self.compare and older is not None and before is not None
        previous_label = self.query_one("#previous-label", Static)
        previous_label.display = self.compare
        self.query_one("#previous-box").display = compare
        if compare and older is not None and before is not None:
            wanted.append(str(before.png))
            self._show("previous", before.png, clip_label(older, before, "(previous validation)"))
        elif self.compare:
            previous_label.update(Content.styled("no earlier validation to compare with", "dim"))
        amplify = f"×{step.amplify:g}" if step.amplify else "amplified"
        legend: list[str | Content] = [
            Content.styled("rows ", "dim"),
            f"input · reconstruction · error {amplify}",
            Content.styled("   source ", "dim"),
            clip.source,
        ]
        if clip.video is not None:
            legend += [Content.styled("\nvideo ", "dim"), str(clip.video)]
        self.query_one("#samples-legend", Static).update(Content.assemble(*legend))
        missing = tuple(p for p in wanted if p not in self._images)
        if missing:
            self._read(missing)

    def _show(self, which: str, png: Path, label: Content) -> None:
        image = self._images.get(str(png))
        widget = self.query_one(f"#{which}-strip")
        if isinstance(image, str):  # the file could not be read: say so where the strip would be
            label = Content.assemble(label, "\n", Content.styled(image, "$warning"))
            image = None
        if getattr(widget, "image", None) is not image:
            widget.image = image  # type: ignore[attr-defined]  # every IMAGE_WIDGETS class has it
            # Textual's log (TEXTUAL_LOG, devtools): which renderer drew what, at which size
            renderable = getattr(type(widget), "_Renderable", None)  # textual-image's choice of method
            self.log(
                f"samples: {which} strip {png.name} drawn by {type(widget).__name__} "
                f"({getattr(renderable, '__module__', '?')}) in {widget.size}"
            )
            self.call_after_refresh(self._lay_out_if_empty, widget)
        self.query_one(f"#{which}-label", Static).update(label)

    def _lay_out_if_empty(self, widget: Widget) -> None:
        """A strip that holds an image but has no size once the screen has refreshed is laid out
        again. Seen twice in CI under load, in tmux: the layout after the image was set gave the
        widget 0x0 and no later one changed it, so the strip stayed blank (not reproduced outside CI)."""
        if getattr(widget, "image", None) is not None and widget.size.area == 0:
            self.log(f"samples: {widget.id} has an image but no size after a refresh: laid out again")
            widget.refresh(layout=True)

    # ---------------------------------------------------------------- keys
    def action_clip(self, delta: int) -> None:
        chosen = self._selection()
        if chosen is not None:
            self.clip_at = (self.clip_at + delta) % len(chosen[0].clips)
            self._draw()

    def action_step(self, delta: int) -> None:
        if not self.steps:
            return
        at = min(max(0, self.step_at + delta), len(self.steps) - 1)
        if at == self.step_at:
            self.notify("this is the newest validation" if delta < 0 else "no earlier validation", timeout=2)
            return
        self.step_at = at
        self._draw()

    def action_toggle_compare(self) -> None:
        self.compare = not self.compare
        self._draw()

    def action_back(self) -> None:
        self.app.pop_screen()
