"""Wizard step 4, Review: the TAE family (what it serves, its export name, the clip it trains on)
and the planner's figures for the chosen config (communication share at the
measured or assumed bandwidth, step time, time to max steps, GPU-hours, memory fit) and the exact
command every node will run; `s` launches."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.screen import Screen
from textual.widgets import Footer, Static

from taehv_console.core.plan.timeouts import collective_timeout_brief
from taehv_console.core.run.recovery import policy_lines
from taehv_console.ui import formatting as f
from taehv_console.ui.formatting import findings_content
from taehv_console.ui.widgets.steps import WizardSteps
from trainer.families import FAMILIES, exported_files

if TYPE_CHECKING:
    from textual import getters

    from taehv_console.core.flow.launch import Review
    from taehv_console.ui.apptype import ConsoleApp


def figures_content(review: Review) -> Content:
    plan = review.plan
    cfg = review.config
    t, c, m = plan.time, plan.comm, plan.memory
    o = cfg.optim

    def row(label: str, *value: str | Content) -> Content:
        return Content.assemble(Content.styled(f"{label:<18}", "dim"), *value)

    lines = [
        row("config", Content.styled(cfg.run.preset, "bold"), f"  ({review.chosen})"),
        row(
            "family",
            Content.styled(cfg.model.family, "bold"),
            f"  {FAMILIES[cfg.model.family].serves if cfg.model.family in FAMILIES else 'the preset’s own shapes'}",
            Content.styled(f"   exported as {exported_files(cfg.model.family)[0]} + .pth", "dim"),
            f"   clips {cfg.data.frames}×{cfg.data.height}×{cfg.data.width}",
        ),
        row(
            "topology",
            f"{cfg.topology.nodes} node(s) × {cfg.topology.gpus_per_node} = {cfg.topology.world_size} "
            f"{'GPUs' if cfg.topology.device == 'cuda' else 'CPU processes'}",
        ),
        row(
            "batch",
            f"{o.batch_per_gpu}/GPU × accum {o.grad_accum} = effective {cfg.effective_batch}",
            f"   LR {o.lr:g}   ZeRO {cfg.deepspeed.zero_stage}   max steps {o.max_steps}",
        ),
        row(
            "communication",
            Content.styled(f"{100 * c.fraction:.0f}%", "bold"),
            f" of a step ({c.seconds_per_step:.3g} s per step over {review.bandwidth})",
        ),
        row(
            "step time",
            f"{t.step_s:.3g} s  ({t.compute_s_per_step:.3g} s compute)   {t.clips_per_s:.3g} clips/s",
        ),
        row(
            "to max steps",
            Content.styled(f.duration(t.hours_to_max_steps * 3600), "bold"),
            f"   {t.gpu_hours:,.0f} GPU-hours" + (f"   cost {t.cost:,.0f}" if t.cost is not None else ""),
        ),
        row(
            "memory",
            f.badge("ok" if m.fits else "failed"),
            f" {m.per_gpu_gb:.1f} of {m.gpu_gb:g} GB per device (largest batch that fits: {m.max_batch_per_gpu})",
        ),
        row("coll. timeout", collective_timeout_brief(cfg)),
    ]
    # what the ZeRO stage and buckets cost this model, and how they would be sized (core/plan/zero.py)
    lines += [row("deepspeed" if i == 0 else "", line) for i, line in enumerate(plan.deepspeed)]
    if plan.teacher is not None and plan.teacher.mode != "off":
        from taehv_console.core.plan.planner import teacher_lines

        head, *rest = teacher_lines(plan.teacher, lambda h: f.duration(h * 3600))
        lines.append(row("recipe", head))
        lines += [row("", line.strip()) for line in rest]
    if plan.checkpoint is not None:
        every = cfg.schedule.checkpoint_every
        lost = plan.checkpoint.loss_per_failure_s
        lines.append(
            row(
                "checkpoints",
                f"every {every:,} steps ({f.duration(every * t.step_s)}); a failure loses "
                f"{f.duration(lost)} on average",
            )
        )
    head, *rest = policy_lines(cfg.recovery, cfg.notify, t.step_s)
    lines.append(row("recovery", head))
    lines += [row("", line) for line in rest]
    if c.fraction > c.target_fraction and c.smallest_accum_under_target:
        lines.append(
            row(
                "",
                Content.styled(
                    f"accumulation {c.smallest_accum_under_target} would keep communication "
                    f"under {100 * c.target_fraction:.0f}%",
                    "$warning",
                ),
            )
        )
    for a in plan.assumptions:
        lines.append(row("assumed", Content.styled(a, "dim")))
    return Content("\n").join(lines)


def commands_content(review: Review) -> Content:
    lines: list[Content] = [
        Content.assemble(Content.styled("run directory ", "dim"), review.run_path),
        Content.assemble(
            Content.styled("backend ", "dim"),
            review.backend.value,
            Content.styled("  master ", "dim"),
            f"{review.master}:{review.master_port}",
        ),
        Content(""),
    ]
    for n in review.commands:
        lines.append(Content.styled(f"node {n.node} ({n.host})", "bold"))
        lines.append(Content(f"  {n.command}"))
    if review.env:
        lines.append(Content(""))
        lines.append(Content.styled("environment on every node", "bold"))
        for k, v in review.env:
            lines.append(Content(f"  {k}={v}"))
    if review.findings:
        lines.append(Content(""))
        lines.append(Content.styled("preflight for this config", "bold"))
        lines.append(findings_content(tuple(x for x in review.findings if x.severity.value != "info")))
    return Content("\n").join(lines)


class ReviewScreen(Screen):
    if TYPE_CHECKING:
        app = getters.app(ConsoleApp)

    CSS_PATH = "wizard.tcss"
    # textual declares it "ClassVar[...] | None", which mypy reads as an instance variable
    HORIZONTAL_BREAKPOINTS: ClassVar[list[tuple[int, str]]] = [(0, "-narrow"), (100, "-wide")]  # type: ignore[misc]
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            "s", "start_run", "Start", id="start", tooltip="Create the run directory and launch every node"
        ),
        Binding("escape", "back", "Back", id="back", tooltip="Previous step"),
    ]

    def compose(self) -> ComposeResult:
        # The contents are given here, not set in on_mount: a widget nested in a container is
        # mounted with the container, which a loaded machine can run after this screen's Mount
        # (then "#commands-text" was not found and the wizard crashed)
        review = self.app.wizard.review
        yield WizardSteps(3, classes="steps")
        figures = Static(figures_content(review) if review else "", id="figures")
        figures.border_title = "plan"
        yield figures
        yield Static(self._status_content(review), id="review-status")
        with VerticalScroll(id="commands") as commands:
            commands.border_title = "what each node runs"
            yield Static(commands_content(review) if review else "", id="commands-text")
        yield Footer(compact=True)

    @staticmethod
    def _status_content(review: Review | None) -> Content | str:
        if review is None:
            return ""
        if review.blocked:
            return Content.assemble(f.badge("failed"), f" {review.blocked}: go back (escape) and fix it")
        return Content.assemble(
            f.badge("ok"), " ready: ", Content.styled("s", "bold $accent"), f" starts {review.run_id}"
        )

    def action_start_run(self) -> None:
        review = self.app.wizard.review
        if review is None:
            return
        if review.blocked:
            self.notify(review.blocked, severity="error")
            return
        self.app.launch_run(review)

    def action_back(self) -> None:
        self.app.pop_screen()
