"""What the wizard has found so far (core's values, kept for the screens to draw); each step's
screen fills in its part. The steps themselves are core's flow (taehv_console.core.flow)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from taehv_console.core.models import ProbeResult, Topology

if TYPE_CHECKING:  # annotations only: these modules load the planner's pydantic models (~0.5 s)
    from taehv_console.core.flow.config import ChosenConfig
    from taehv_console.core.flow.launch import Review
    from taehv_console.core.flow.preflight import PreflightResult


@dataclass
class WizardState:
    topology: Topology | None = None
    probes: tuple[ProbeResult, ...] = ()
    preflight: PreflightResult | None = None
    preset: str | None = None  # chosen on the preset screen ("auto" or a name)
    overrides: list[str] = field(default_factory=list)
    chosen: ChosenConfig | None = None  # the config the review was made for
    review: Review | None = None
