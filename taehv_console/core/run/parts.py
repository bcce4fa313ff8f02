"""What the run controller's parts (launching.py, liveness.py, stopping.py, recovering.py,
excluding.py) use of the controller, declared once for the type checker. RunController
(control.py) or another part defines each of them; at run time this class is empty."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taehv_console.core.cluster.ssh import SshPool
    from taehv_console.core.models import BackendKind
    from taehv_console.core.run.backends import LaunchBackend
    from taehv_console.core.run.lock import RunLock
    from taehv_console.core.run.notify import Notifier
    from taehv_console.core.run.outcome import RunSnapshot
    from taehv_console.core.run.progress import AttemptEvents, RunProgress
    from taehv_console.core.run.rundir import RunDir
    from taehv_console.core.run.state import Attempt, Failure, NodeStatus, RunState
    from trainer.config import TrainConfig


class ControllerParts:
    if TYPE_CHECKING:
        run: RunDir
        cfg: TrainConfig
        state: RunState
        backend: LaunchBackend
        lock: RunLock
        pool: SshPool
        notifier: Notifier
        grace_s: float
        hurry: bool
        _killed: tuple[str, ...]
        _pending_recovery: Attempt | None
        _fault_time: float | None
        _hardware: Callable[[], Mapping[str, str]] | None
        _last_liveness: float
        _gone_since: dict[int, float]
        _vanished: dict[int, str]
        _unreachable: dict[int, tuple[float, str]]

        @property
        def attempt(self) -> Attempt | None: ...
        @property
        def kind(self) -> BackendKind: ...
        @property
        def world_size(self) -> int: ...
        def _diagnose(
            self,
            statuses: Mapping[int, NodeStatus],
            progress: RunProgress,
            vanished: Sequence[tuple[int, str]],
            failing: Mapping[int, int | None],
            now: float,
        ) -> Failure: ...
        def _event_text(self, text: str) -> str: ...
        def _fail(self, failure: Failure) -> None: ...
        def _host(self, node: int) -> str | None: ...
        def _fit_allocation(self, env: Mapping[str, str] | None = None) -> None: ...
        def _launched(self) -> Attempt: ...
        def _note(self, text: str) -> None: ...
        def _record_refusals(self) -> dict[int, str]: ...
        def _reset_follow(self) -> None: ...
        def _save(self, state: RunState) -> RunState: ...
        def _statuses(self) -> dict[int, NodeStatus]: ...
        def _stop_request(self) -> dict[str, Any] | None: ...
        def _tail(self) -> AttemptEvents: ...
        def _watched_ranks(self) -> set[int]: ...
        def live_nodes(self) -> dict[int, tuple[int, ...]]: ...
        def launch(
            self, resume: str | None = None, weights_only: bool = False, restarted: int | None = None
        ) -> RunState: ...
        def reconcile(self) -> str: ...
        def snapshot(self, events: Sequence[Mapping[str, Any]] = ()) -> RunSnapshot: ...
