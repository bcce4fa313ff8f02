"""The wizard's step line: where the user is in detect -> preflight -> preset -> review."""

from __future__ import annotations

from typing import Any

from textual.content import Content
from textual.widgets import Static

STEPS = ("Detect", "Preflight", "Preset", "Review")


class WizardSteps(Static):
    def __init__(self, current: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.current = current

    def on_mount(self) -> None:
        parts: list[Content | str] = []
        for i, name in enumerate(STEPS):
            if i:
                parts.append(Content.styled("  ›  ", "dim"))
            label = f"{i + 1} {name}"
            if i == self.current:
                parts.append(Content.styled(f" {label} ", "bold reverse $accent"))
            elif i < self.current:
                parts.append(Content.styled(f"✓ {label}", "$success"))
            else:
                parts.append(Content.styled(label, "dim"))
        self.update(Content.assemble(*parts))
