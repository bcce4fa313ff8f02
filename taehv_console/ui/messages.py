"""Typed messages from thread workers to the UI: each is named for what happened and carries
immutable values from core (never a live object a widget could query)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:  # annotations only: the flow modules load the planner's pydantic models
    from PIL.Image import Image as PILImage

    from taehv_console.core.flow.config import ChosenConfig, PresetChoice
    from taehv_console.core.flow.launch import Review
    from taehv_console.core.flow.preflight import PreflightResult
    from taehv_console.core.flow.runs import RunEntry
    from taehv_console.core.models import ProbeResult, Topology
    from taehv_console.core.run.outcome import Outcome, RunSnapshot
    from taehv_console.core.watch.samples import SampleStep
    from taehv_console.core.watch.state import RunView
    from taehv_console.ui.session import RunSession


class ClusterUpdated(Message):
    """The monitor published a new ClusterState. A newer one replaces a pending one, so a slow
    screen skips stale snapshots instead of queueing them."""

    def __init__(self, state: RunView) -> None:
        super().__init__()
        self.state = state

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ClusterUpdated)


class RunProgressed(Message):
    """The controller's follow loop reported: phase, attempt, console notes (stop sent ...)."""

    def __init__(self, snapshot: RunSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class RunAttached(Message):
    """This console now controls a run (launched, resumed or attached): the dashboard follows it.
    `session` is the app's handle on it (ui.session.RunSession); widgets never receive it."""

    def __init__(self, session: RunSession, how: str, lines: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.session = session
        self.run_id = session.run.run_id
        self.run_path = str(session.run.path)
        self.how = how  # launched | resumed | attached | ended (attached to a run that had ended)
        self.lines = lines


class RunEnded(Message):
    """The run reached an end (done, stopped, failed); `outcome` is core's Outcome."""

    def __init__(self, outcome: Outcome) -> None:
        super().__init__()
        self.outcome = outcome


class ControlFailed(Message):
    """A control action (launch, stop, resume, attach) was refused or failed; `message` says why
    and what to do."""

    def __init__(self, action: str, message: str) -> None:
        super().__init__()
        self.action = action
        self.message = message


class NoteAdded(Message):
    """A line of progress from a worker (preflight steps, clip generation ...)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class TopologyDetected(Message):
    def __init__(self, topology: Topology, hosts: tuple[str, ...]) -> None:
        super().__init__()
        self.topology = topology
        self.hosts = hosts


class NodeProbed(Message):
    def __init__(self, result: ProbeResult) -> None:
        super().__init__()
        self.result = result


class DetectionFinished(Message):
    def __init__(self, topology: Topology, probes: tuple[ProbeResult, ...]) -> None:
        super().__init__()
        self.topology = topology
        self.probes = probes


class DetectionFailed(Message):
    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message


class HostTrusted(Message):
    def __init__(self, host: str, message: str) -> None:
        super().__init__()
        self.host = host
        self.message = message


class PreflightFinished(Message):
    def __init__(self, result: PreflightResult, chosen: ChosenConfig) -> None:
        super().__init__()
        self.result = result  # core.flow.PreflightResult
        self.chosen = chosen  # core.flow.ChosenConfig it checked


class PresetChoicesReady(Message):
    def __init__(self, choices: tuple[PresetChoice, ...]) -> None:
        super().__init__()
        self.choices = choices


class ReviewReady(Message):
    def __init__(self, review: Review) -> None:
        super().__init__()
        self.review = review  # core.flow.Review


@dataclass(frozen=True)
class LogChunk:
    node: int
    lines: tuple[str, ...]
    reset: bool = False  # the file was replaced or truncated: start over


class LogRead(Message):
    def __init__(self, chunk: LogChunk) -> None:
        super().__init__()
        self.chunk = chunk


class RunsListed(Message):
    def __init__(self, runs: tuple[RunEntry, ...]) -> None:
        super().__init__()
        self.runs = runs  # core.flow.RunEntry


class SamplesListed(Message):
    """The run's complete sample steps (core SampleStep, newest first), read again because the
    list changed; `val_every` is the run's schedule.val_every, for the empty state's words."""

    def __init__(self, steps: tuple[SampleStep, ...], val_every: int | None) -> None:
        super().__init__()
        self.steps = steps
        self.val_every = val_every


class SampleImagesRead(Message):
    """Strip images read by a worker: path -> the decoded image, or the error text naming it."""

    def __init__(self, images: dict[str, PILImage | str]) -> None:
        super().__init__()
        self.images = images
