"""Wizard step 3, Preset: the config derived for the detected cluster and every shipped and user
preset, each with effective batch, LR, ZeRO stage and the memory estimate against the device;
then the TAE family (trainer/families.py: which video model's latent space the student shares, and
the file its weights are exported as), the overrides form, each field checked by core's validation
as it is typed, and the recipe: reconstruction only, or the author's distillation from the family's
teacher VAE (online or from cached latents), with or without the adversarial term.

Choosing a family checks the preset's clip against the family's clip rule (families.clip_rule) and
proposes the nearest clip that fits: frames to the nearest whole time chunk (LTX 8, H3 17), crop
sides down to whole multiples of 8·p. What it changed is said under the choice, and the overrides
handed on are `model.family=NAME` and those clip values before the form's own.

The config modules (the planner's pydantic models, ~0.5 s to import) are imported in the thread
workers and in the handlers that only run after them: the console's first frame, which builds the
key map from every screen's bindings, never waits for them."""

from __future__ import annotations

import dataclasses
import shlex
from typing import TYPE_CHECKING, ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.content import Content
from textual.widgets import DataTable, Footer, Input, Label, Select, Static

from taehv_console.core.flow.form import FORM_FIELDS, field_text, form_overrides, override_text
from taehv_console.ui import formatting as f
from taehv_console.ui.errors import USER_ERRORS, error_text
from taehv_console.ui.messages import NoteAdded, PresetChoicesReady, ReviewReady
from taehv_console.ui.screens.base import ConsoleScreen
from taehv_console.ui.screens.review import ReviewScreen
from taehv_console.ui.widgets.steps import WizardSteps
from trainer.families import FAMILIES, exported_files

if TYPE_CHECKING:
    from textual import getters

    from taehv_console.core.flow.config import PresetChoice
    from taehv_console.ui.apptype import ConsoleApp
    from trainer.config import TrainConfig

COLUMNS = ("preset", "here", "topology", "batch", "LR", "ZeRO", "memory/device", "fits")
MORE = "more"
# The recipe is a switch on any preset rather than a twin of each: it composes with every shipped,
# user and derived preset, and is the same one `--set loss.teacher=DIR` headless.
RECIPE_FIELDS: tuple[tuple[str, str], ...] = (
    ("loss.teacher", "teacher VAE dir"),
    ("loss.teacher_cache", "latent cache dir"),
    ("adversarial.weight", "adversarial weight"),
)
FIELDS = FORM_FIELDS + RECIPE_FIELDS
FAMILY_FIELD = "model.family"
RECIPE_HINT = (
    "recipe: empty teacher = reconstruction only; a diffusers {teacher} directory = "
    "distil to its latents (preflight loads it on every node); a cache dir = latents from "
    "`taehv-train cache-latents`, the teacher never loaded"
)


def family_options(base_family: str) -> list[tuple[str, str]]:
    """The family choice's rows: each family with the model it serves (the base's `custom` shapes
    too, when the preset has them)."""
    rows = [(f"{name:<15} {fam.serves}", name) for name, fam in FAMILIES.items()]
    if base_family not in FAMILIES:
        rows.append((f"{base_family:<15} the preset's own shapes", base_family))
    return rows


def family_overrides(base: TrainConfig, family: str) -> tuple[list[str], list[str]]:
    """(--set entries, what each changed in words) for training `family` from the `base` config:
    `model.family=NAME` and the clip values the family's clip rule needs (none for the base's own
    family): core's fit, the one `--set model.family=NAME` gets on the command line."""
    from taehv_console.core.plan.presets import family_clip_fit  # start-up: see the module's docstring

    if family == base.model.family:
        return [], []
    fits = family_clip_fit(base, family)
    return [f"{FAMILY_FIELD}={family}", *(f.setting for f in fits)], [f.said for f in fits]


def family_note(family: str, said: list[str], error: str) -> Content:
    """Under the family choice (whose row names the model it serves): the export name, what the
    clip had to become, or why it cannot be."""
    weights, _ema = exported_files(family)
    head = Content.assemble("exported as ", Content.styled(weights, "bold"), " + .pth")
    if error:
        return Content("\n").join([head, Content.styled(error, "$error")])
    if said:
        return Content("\n").join(
            [head, Content.styled(f"{family}'s clip rule: " + "; ".join(said), "$warning")]
        )
    return head


def recipe_summary(cfg: TrainConfig) -> str:
    """One line on what the chosen recipe costs, from the planner (online teacher beside cached)."""
    from taehv_console.core.plan.planner import make_plan  # start-up: see the module's docstring

    t = make_plan(cfg).teacher
    if t is None or t.mode == "off":
        return "recipe: reconstruction only (set a teacher VAE dir for the author's distillation)"
    return (
        f"recipe: distil, teacher {t.mode}: online {t.online_gpu_hours:,.0f} GPU-h vs cached "
        f"{t.cached_gpu_hours:,.0f} GPU-h (+{t.cache_build_gpu_hours:,.0f} per 100k windows once)"
    )


def choice_row(c: PresetChoice) -> tuple[str | Content, ...]:
    if c.error:
        return (c.title, "", Content.styled(c.error[:70], "$error"), "", "", "", "", "")
    here = Content.styled("✓", "bold $success") if c.matches else ""
    mem = f"{c.memory_gb:.1f}/{c.device_gb:g} GB" if c.memory_gb is not None else "-"
    fits = f.badge("ok") if c.fits else f.badge("failed")
    return (c.title, here, c.topology, str(c.effective_batch), f"{c.lr:g}", str(c.zero_stage), mem, fits)


def choice_info(c: PresetChoice) -> Content:
    lines = [Content.assemble(Content.styled(c.title, "bold"), f"  {c.description}" if c.description else "")]
    for key, why in c.reasons[:8]:
        lines.append(Content.assemble(Content.styled(f"  {key}: ", "dim"), why))
    return Content("\n").join(lines)


class PresetScreen(ConsoleScreen):
    if TYPE_CHECKING:
        app = getters.app(ConsoleApp)

    CSS_PATH = "wizard.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("n", "next_step", "Continue", id="next-step", tooltip="Review the plan and the commands"),
        Binding("escape", "back", "Back", id="back", tooltip="Previous step"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._choices: dict[str, PresetChoice] = {}
        self._selected: PresetChoice | None = None
        self._errors: dict[str, str] = {}
        # the family chosen, and the overrides that choice adds before the form's (family_overrides)
        self._family: str | None = None
        self._family_sets: list[str] = []
        self._family_base: TrainConfig | None = None  # the preset's config with them
        self._family_rows = family_options("taehv")

    def compose(self) -> ComposeResult:
        yield WizardSteps(2, classes="steps")
        yield DataTable(id="choices", cursor_type="row", zebra_stripes=True)
        yield Static("", id="choice-info")
        with VerticalScroll(id="preset-form"):
            with Horizontal(classes="form-field"):
                yield Label("TAE family")
                yield Select(
                    family_options("taehv"),
                    value="taehv",
                    allow_blank=False,
                    id="field-model-family",
                    name=FAMILY_FIELD,
                    compact=True,
                )
            yield Static("", id="family-info", classes="form-note")
            for key, label in FIELDS:
                if key == RECIPE_FIELDS[0][0]:
                    yield Static(RECIPE_HINT.format(teacher="VAE"), id="recipe-hint", classes="form-error")
                with Horizontal(classes="form-field"):
                    yield Label(label)
                    yield Input(id=f"field-{key.replace('.', '-')}", name=key, compact=True)
                yield Static("", id=f"error-{key.replace('.', '-')}", classes="form-error -hidden")
            with Horizontal(classes="form-field"):
                yield Label("more overrides")
                yield Input(
                    placeholder="section.key=value ... e.g. schedule.val_every=500",
                    id="field-more",
                    name=MORE,
                    compact=True,
                )
            yield Static("", id="error-more", classes="form-error -hidden")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#choices", DataTable).add_columns(*COLUMNS)
        self.query_one("#choices").border_title = "presets"
        self.query_one("#preset-form").border_title = "overrides (checked as you type)"
        self._load()

    @work(thread=True, exclusive=True, group="presets", exit_on_error=False)
    def _load(self) -> None:
        from taehv_console.core.flow.config import preset_choices  # start-up: see the module's docstring

        w = self.app.wizard
        assert w.topology is not None  # detection found one before the wizard came this far
        self.post_message(PresetChoicesReady(preset_choices(self.app.options, w.topology, w.probes)))

    def on_preset_choices_ready(self, message: PresetChoicesReady) -> None:
        table = self.query_one("#choices", DataTable)
        table.clear()
        self._choices = {}
        for c in message.choices:
            if c.name in self._choices:
                continue
            self._choices[c.name] = c
            table.add_row(*f.table_row(choice_row(c)), key=c.name)
        wanted = self.app.wizard.preset or self.app.options.preset
        names = list(self._choices)
        table.move_cursor(row=names.index(wanted) if wanted in names else 0)
        table.focus()
        self._select(names[table.cursor_row] if names else None, initial=True)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "choices" and event.row_key is not None:
            self._select(event.row_key.value)

    def _select(self, name: str | None, initial: bool = False) -> None:
        from taehv_console.core.flow.config import check_overrides  # loaded by _load by now

        choice = self._choices.get(name) if name else None
        if choice is None or choice is self._selected:
            return
        self._selected = choice
        self.query_one("#choice-info", Static).update(choice_info(choice))
        if choice.config is None:
            return
        w = self.app.wizard
        overrides = w.overrides if (initial and w.overrides) else list(self.app.options.overrides)
        # the family: the one chosen here already (it stays when another preset is highlighted),
        # else the one the overrides name (--set model.family=X, or this wizard's last choice),
        # else the preset's own; its clip values are the family choice's, not the form's
        own = choice.config.model.family
        named = [
            o.partition("=")[2].strip().strip("\"'")
            for o in overrides
            if o.partition("=")[0].strip() == FAMILY_FIELD
        ]
        family = self._family if self._family in FAMILIES else (named[-1] if named else own)
        if family not in FAMILIES and family != own:
            family = own  # an unknown name: it stays in "more overrides", which says why
        else:
            overrides = [o for o in overrides if o.partition("=")[0].strip() != FAMILY_FIELD]
        select = self.query_one("#field-model-family", Select)
        rows = family_options(choice.config.model.family)
        if rows != self._family_rows:  # a preset of custom shapes offers them too
            self._family_rows = rows
            select.set_options(rows)
        select.value = family
        self._choose_family(family)
        overrides = [o for o in overrides if o not in self._family_sets]
        # each override applied on its own: the valid ones fill the form, a bad one stays in
        # "more overrides" with its message under it
        shown, rejected = self._base() or choice.config, []
        for o in overrides:
            applied, err = check_overrides(shown, [o])
            if err:
                rejected.append(o)
            elif applied is not None:  # no error: the config with it
                shown = applied
        form_keys = {k for k, _ in FIELDS}
        for key, _label in FIELDS:
            self.query_one(f"#field-{key.replace('.', '-')}", Input).value = field_text(shown, key)
        more = [o for o in overrides if o.partition("=")[0].strip() not in form_keys or o in rejected]
        self.query_one("#field-more", Input).value = " ".join(more)
        self._validate_all()

    # ---------------------------------------------------------------- family
    def _base(self) -> TrainConfig | None:
        """The config the form's fields are checked against: the preset's, with the family's."""
        if self._selected is None:
            return None
        return self._family_base or self._selected.config

    def on_select_changed(self, event: Select.Changed) -> None:
        chosen = event.value
        if event.select.id == "field-model-family" and isinstance(chosen, str) and chosen != self._family:
            self._choose_family(chosen)
            self._validate_all()

    def _choose_family(self, family: str) -> None:
        """The family's overrides (its clip rule's values where the preset's do not fit), checked
        by core's validation; an error that remains is said under the choice and blocks Continue."""
        from taehv_console.core.flow.config import check_overrides  # loaded by _load by now

        base = self._selected.config if self._selected is not None else None
        if base is None:
            return
        sets, said = family_overrides(base, family)
        cfg, err = check_overrides(base, sets) if sets else (base, "")
        self._family, self._family_sets = family, sets
        self._family_base = cfg if not err else None
        self._errors[FAMILY_FIELD] = err
        info = self.query_one("#family-info", Static)
        info.update(family_note(family, said, err))
        self.query_one("#field-model-family", Select).set_class(bool(err), "-invalid")

    # ---------------------------------------------------------------- form
    def _fields(self) -> tuple[dict[str, str], str]:
        values = {k: self.query_one(f"#field-{k.replace('.', '-')}", Input).value for k, _ in FIELDS}
        return values, self.query_one("#field-more", Input).value

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.name:
            self._validate(event.input.name)

    def _validate_all(self) -> None:
        for key, _ in FIELDS:
            self._validate(key)
        self._validate(MORE)

    def _validate(self, key: str) -> None:
        """Core's own validation, one field at a time, so each message sits under its field."""
        from taehv_console.core.flow.config import check_overrides  # loaded by _load by now

        base = self._base()
        if base is None:
            return
        values, more = self._fields()
        if key == MORE:
            try:
                overrides = [x for x in shlex.split(more) if x]
                _, err = check_overrides(base, overrides)
            except ValueError as e:  # unbalanced quotes
                err = f"cannot split the line: {e}"
        else:
            text = values[key]
            _, err = (
                ("", "")
                if text.strip() == field_text(base, key)
                else check_overrides(base, [override_text(key, text, base)])
            )
        self._errors[key] = err
        dom = key.replace(".", "-")
        box = self.query_one(f"#error-{dom}", Static)
        box.update(err)
        box.set_class(not err, "-hidden")
        self.query_one(f"#field-{dom}", Input).set_class(bool(err), "-invalid")
        if key in dict(RECIPE_FIELDS):
            self._show_recipe(base, values)

    def _show_recipe(self, base: TrainConfig, values: dict[str, str]) -> None:
        """The hint under the recipe fields, with the planner's cost of the recipe as typed."""
        from taehv_console.core.flow.config import check_overrides  # loaded by _load by now

        typed = [
            override_text(k, values[k], base)
            for k, _ in RECIPE_FIELDS
            if values[k].strip() != field_text(base, k)
        ]
        cfg, err = check_overrides(base, typed)
        fam = FAMILIES.get(base.model.family)
        hint = RECIPE_HINT.format(teacher=fam.teacher_class if fam is not None else "VAE")
        self.query_one("#recipe-hint", Static).update(
            hint + ("" if err or cfg is None else "\n" + recipe_summary(cfg))
        )

    # ---------------------------------------------------------------- navigation
    def action_next_step(self) -> None:
        if self._selected is None or self._selected.config is None:
            self.notify("choose a preset that loads", severity="warning")
            return
        bad = {k: v for k, v in self._errors.items() if v}
        if bad:
            self.notify("fix the overrides marked in red first", severity="error")
            return
        values, more = self._fields()
        base = self._base()
        assert base is not None  # a selected config, and the family's checked (no error above)
        overrides = self._family_sets + form_overrides(base, values, more)
        self._build(self._selected.name, overrides)

    @work(thread=True, exclusive=True, group="review", exit_on_error=False)
    def _build(self, preset: str, overrides: list[str]) -> None:
        from taehv_console.core.flow.config import run_config  # start-up: see the module's docstring
        from taehv_console.core.flow.launch import review

        w = self.app.wizard
        # detection and preflight finished before the preflight screen let the wizard come here
        assert w.topology is not None and w.preflight is not None
        options = dataclasses.replace(self.app.options, preset=preset, overrides=tuple(overrides))

        def note(text: str) -> None:
            self.post_message(NoteAdded(text))

        try:
            chosen = run_config(options, w.topology, w.probes, note=note)
            reviewed = review(options, w.topology, w.probes, w.preflight, chosen, self.app.pool, note)
        except USER_ERRORS as err:  # errors.py's table: a config, a platform, a data source
            self.post_message(NoteAdded(f"error: {error_text(err)}"))
            return
        w.preset, w.overrides, w.chosen = preset, overrides, chosen
        self.post_message(ReviewReady(reviewed))

    def on_note_added(self, message: NoteAdded) -> None:
        self.notify(message.text, severity="error" if message.text.startswith("error:") else "information")

    def on_review_ready(self, message: ReviewReady) -> None:
        self.app.wizard.review = message.review
        self.app.push_screen(ReviewScreen())

    def action_back(self) -> None:
        self.app.pop_screen()
