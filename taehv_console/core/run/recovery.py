"""What to do about a failed attempt: pure functions of observations, so every rule is tested on
recorded inputs and the controller only carries decisions out.

`classify` names a failure's cause and whether another attempt could get past it; `decide` weighs
that against the run's recovery policy (the `[recovery]` section of run.toml) and its history of
attempts: restart (after a backoff), leave a node out, fail at once, or give up.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from taehv_console.core.run.state import Attempt, Failure
from trainer.config import NotifySection, RecoverySection

# The stall bound when the policy leaves it to the step time: long enough for this model's
# checkpoint saves and validation passes (seconds at 11M parameters) and for a slow step to
# finish, far shorter than the collective timeout (1-4 h on the published presets) that ends a
# hang otherwise.
STALL_FLOOR_S = 180.0
STALL_STEPS = 20


class CauseKind(str, enum.Enum):
    SIGNAL = "signal"  # a rank killed by a signal (the OOM killer, kill -9, a segfault)
    COMMUNICATION = "communication"  # a collective, NCCL or gloo error or timeout
    NODE_LOST = "node-lost"  # a launcher gone without a word, a node unreachable
    DEVICE = "device"  # CUDA or driver faults, Xid, ECC
    STALL = "stall"  # a rank stopped making progress (ended by the console)
    DISK_FULL = "disk-full"
    EXCEPTION = "exception"  # the trainer's own error: it would happen again
    LAUNCH = "launch"  # the launcher could not be started
    PORT_IN_USE = "port-in-use"  # the rendezvous port was taken on node 0: relaunched on a free one
    UNKNOWN = "unknown"  # a launcher exited non-zero and said nothing more

    @property
    def retryable(self) -> bool:
        return self in _RETRYABLE

    @classmethod
    def parse(cls, value: str) -> CauseKind:
        """A kind as state.json records it; UNKNOWN for "" or a kind this console does not know."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN


_RETRYABLE = {
    CauseKind.SIGNAL,
    CauseKind.COMMUNICATION,
    CauseKind.NODE_LOST,
    CauseKind.DEVICE,
    CauseKind.STALL,
    CauseKind.PORT_IN_USE,
}
# Kinds that say the node itself is bad: a strike against it at once, and enough to leave it out.
_HARDWARE = {CauseKind.DEVICE}

_DEVICE = re.compile(
    r"CUDA error|CUBLAS_STATUS|cuDNN error|Xid|ECC error|uncorrectable|device-side assert is not|"
    r"NVML.*(lost|unknown error)|GPU is lost|driver shutting down",
    re.IGNORECASE,
)
_COMMUNICATION = re.compile(
    r"NCCL|gloo|DistBackendError|ProcessGroup|collective|Connection (closed|reset|refused) by peer|"
    r"Broken pipe|timed? ?out|Timeout|watchdog|c10d|rendezvous|Socket Timeout",
    re.IGNORECASE,
)
_DATA_OR_CONFIG = re.compile(
    r"ConfigError|no (readable )?videos?|No such file|FileNotFoundError|not a directory|KeyError|"
    r"ValueError|TypeError|AssertionError|out of memory|OutOfMemoryError",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Cause:
    kind: CauseKind
    why: str  # one line for a person: what happened and why it is (not) retried
    node: int | None = None  # the node blamed, when one is

    @property
    def retryable(self) -> bool:
        return self.kind.retryable


def classify(failure: Failure) -> Cause:
    """The cause of a failed attempt, from the failure the controller diagnosed (its `kind`, then
    its words). A trainer error is retried only when its words say communication or device: a bug,
    bad data or a bad config would fail the same way again. A node is blamed for a signal, a loss,
    a device fault or a stall, never for an error every node would have."""
    kind = _kind(failure)
    retry = (
        "retried"
        if kind.retryable
        else "not retried: nothing says why"
        if kind in (CauseKind.UNKNOWN, CauseKind.LAUNCH)
        else "not retried: it would fail the same way again"
    )
    blamed = failure.node if kind in _BLAMES_NODE else None
    return Cause(kind=kind, why=f"{kind.value}: {failure.summary()} ({retry})", node=blamed)


_BLAMES_NODE = {CauseKind.SIGNAL, CauseKind.NODE_LOST, CauseKind.DEVICE, CauseKind.STALL}
# Failure.kind values that name the cause outright (set by choose_failure and the controller)
_DIRECT = {
    "signal": CauseKind.SIGNAL,
    "node-lost": CauseKind.NODE_LOST,
    "stall": CauseKind.STALL,
    "disk-full": CauseKind.DISK_FULL,
    "launch": CauseKind.LAUNCH,
    "port-in-use": CauseKind.PORT_IN_USE,
}


def _kind(failure: Failure) -> CauseKind:
    if failure.kind in _DIRECT:
        return _DIRECT[failure.kind]
    text = "\n".join((failure.reason, *failure.log_lines))
    if _DEVICE.search(text):
        return CauseKind.DEVICE
    # the failing rank's own words first: a ValueError that mentions a timeout is still a bug
    if failure.kind != "symptom" and _DATA_OR_CONFIG.search(failure.reason):
        return CauseKind.EXCEPTION
    if failure.kind == "symptom" or _COMMUNICATION.search(text):
        return CauseKind.COMMUNICATION
    return CauseKind.EXCEPTION if failure.rank is not None else CauseKind.UNKNOWN


def stall_bound_s(policy: RecoverySection, step_time_s: float | None) -> float:
    """How long a stall lasts before the run is restarted: the policy's, or the larger of
    STALL_FLOOR_S and STALL_STEPS step times."""
    if policy.stall_restart_after_s > 0:
        return float(policy.stall_restart_after_s)
    return max(STALL_FLOOR_S, STALL_STEPS * (step_time_s or 0.0))


class Action(str, enum.Enum):
    RESTART = "restart"  # relaunch every node from the newest verified checkpoint
    EXCLUDE = "exclude"  # leave `node` out, then relaunch
    FAIL = "fail"  # the failure would repeat: end FAILED now
    GIVE_UP = "give-up"  # the budget is spent, or restarts make no progress: end FAILED, do not retry
    END = "end"  # recovery is off (max_restarts = 0): end FAILED; another try may work


@dataclass(frozen=True)
class PastAttempt:
    """What decide needs of an earlier failed attempt: its cause and whether it added a checkpoint."""

    cause: CauseKind
    node: int | None
    added_checkpoint: bool


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    delay_s: float = 0.0  # wait this long before acting (backoff)
    restart: int = 0  # this restart's number (1 = the first), for RESTART and EXCLUDE
    of: int = 0  # the budget
    node: int | None = None  # the node left out (EXCLUDE), or the one struck

    @property
    def final(self) -> bool:
        return self.action in (Action.FAIL, Action.GIVE_UP)


def strikes(history: Sequence[PastAttempt]) -> dict[int, int]:
    """node -> strikes: one per failed attempt it was blamed for."""
    out: dict[int, int] = {}
    for a in history:
        if a.node is not None:
            out[a.node] = out.get(a.node, 0) + 1
    return out


def backoff_s(policy: RecoverySection, restart: int) -> float:
    """Wait before restart number `restart` (1-based): backoff_s doubling, at most backoff_max_s."""
    return min(policy.backoff_max_s, policy.backoff_s * 2 ** max(0, restart - 1))


def decide(
    policy: RecoverySection,
    cause: Cause,
    added_checkpoint: bool,
    history: Sequence[PastAttempt] = (),
    *,
    nodes: int = 1,
    can_exclude: bool = False,
    spares: int = 0,
    unreachable: Collection[int] = (),
) -> Decision:
    """What to do about the attempt that just failed with `cause`.

    `added_checkpoint`: whether it published a checkpoint newer than the one it started from.
    `history`: the run's earlier failed attempts this run (oldest first), whose restarts count
    against max_restarts. `nodes`: the run's current node count. `can_exclude`: whether the backend
    can relaunch without a node; `spares`: the spare hosts it could put in one's place.
    `unreachable`: nodes that cannot be reached now: a relaunch onto one could not start, so a
    blamed node among them is left out at once, as on hardware evidence."""
    if cause.kind in (CauseKind.UNKNOWN, CauseKind.LAUNCH):
        # nothing says whether it would repeat: the console does not burn its budget on it, and
        # does not tell a platform not to try again either
        return Decision(Action.END, f"{cause.why}; the cause is not known well enough to restart on")
    if not cause.retryable:
        return Decision(Action.FAIL, cause.why)
    if policy.max_restarts == 0:
        return Decision(
            Action.END, f"{cause.why}; recovery.max_restarts = 0, so the console does not restart it"
        )
    used = len(history)
    if used >= policy.max_restarts:
        return Decision(
            Action.GIVE_UP,
            f"{cause.why}; the restart budget is spent ({used} of {policy.max_restarts} used)",
            of=policy.max_restarts,
        )
    if not added_checkpoint and history and not history[-1].added_checkpoint:
        return Decision(
            Action.GIVE_UP,
            f"{cause.why}; two attempts in a row added no checkpoint, so restarting again would not "
            "make progress",
            of=policy.max_restarts,
        )
    restart = used + 1
    delay = backoff_s(policy, restart)
    count = strikes([*history, PastAttempt(cause.kind, cause.node, added_checkpoint)])
    node = cause.node
    if node is not None:
        struck = count.get(node, 0)
        gone = node in unreachable
        bad = gone or cause.kind in _HARDWARE or struck >= policy.exclude_after
        fewer = nodes - 1 >= policy.min_nodes
        if bad and can_exclude and (spares > 0 or fewer):
            why = (
                "it cannot be reached"
                if gone
                else "hardware evidence"
                if cause.kind in _HARDWARE
                else f"{struck} strikes, exclude_after = {policy.exclude_after}"
            )
            then = "a spare takes its place" if spares > 0 else f"the run goes on with {nodes - 1} node(s)"
            return Decision(
                Action.EXCLUDE,
                f"{cause.why}; node {node} is left out ({why}): {then}",
                delay_s=delay,
                restart=restart,
                of=policy.max_restarts,
                node=node,
            )
        if bad:
            limit = (
                "the backend cannot relaunch without a node"
                if not can_exclude
                else f"no spare, and min_nodes = {policy.min_nodes} keeps all {nodes}"
            )
            return Decision(
                Action.RESTART,
                f"{cause.why}; node {node} has {struck} strike(s) but stays in ({limit})",
                delay_s=delay,
                restart=restart,
                of=policy.max_restarts,
                node=node,
            )
    return Decision(
        Action.RESTART, cause.why, delay_s=delay, restart=restart, of=policy.max_restarts, node=node
    )


@dataclass(frozen=True)
class Stall:
    """A rank the watch names as stalled: how long, whether its forensics are in, and where its
    stack says it stands (`where_stalled`; "" before the forensics)."""

    rank: int
    node: str
    stalled_s: float
    step_time_s: float | None = None
    forensics: bool = False
    where: str = ""


# a frame of the trainer's own code, as py-spy ("trainer/train.py:154") or faulthandler (the full
# path) writes its file
_OWN_FRAME = re.compile(r"\((?:.*/)?trainer/\w+\.py:\d+\)$")


def where_stalled(frames: Sequence[str]) -> str:
    """Where a stalled rank stands, from its main thread's stack (innermost first, "function
    (file:line)"): the innermost frame, and the innermost of the trainer's own frames when that is
    another one (a library's wait alone does not say which step of the loop is stuck)."""
    if not frames:
        return ""
    own = next((f for f in frames if _OWN_FRAME.search(f)), None)
    return frames[0] if own is None or own == frames[0] else f"{frames[0]}, called from {own}"


@dataclass(frozen=True)
class Recovery:
    """A failed attempt the console judged, with what it did and what the next attempt cost."""

    attempt: int
    time: float | None  # when the failed attempt ended
    cause: str
    node: int | None
    action: str
    why: str
    reached_step: int | None
    resumed_from: int | None = None  # the checkpoint step the restart resumed from
    lost_s: float | None = None  # fault to training again: the sum of the three below
    redone_steps: int | None = None
    detect_s: float | None = None  # the last step before the fault to the failure named
    teardown_s: float | None = None  # named to the attempt ended (nothing of it left)
    relaunch_s: float | None = None  # ended to training again (backoff, start-up, checkpoint load)


def _span(start: float | None, end: float | None) -> float | None:
    return round(end - start, 1) if start is not None and end is not None else None


def recoveries(attempts: Sequence[Attempt]) -> list[Recovery]:
    """Each failed attempt the console judged: what `status --json`, the --no-tui result and the
    dashboard's recoveries pane show."""
    out: list[Recovery] = []
    for a, nxt in zip(attempts, [*attempts[1:], None]):
        if not a.decision:
            continue
        after = nxt if nxt is not None and nxt.restarted_by == "recovery" else None
        out.append(
            Recovery(
                attempt=a.number,
                time=a.ended,
                cause=a.cause,
                node=a.blamed_node,
                action=a.decision,
                why=a.why,
                reached_step=a.reached_step,
                resumed_from=after.from_step if after else None,
                lost_s=after.lost_s if after else None,
                redone_steps=after.redone_steps if after else None,
                detect_s=_span(a.last_step_at, a.detected),
                teardown_s=_span(a.detected, a.ended),
                relaunch_s=_span(a.ended, after.trained_at) if after else None,
            )
        )
    return out


def strike_counts(attempts: Sequence[Attempt]) -> dict[int, int]:
    """node -> strikes over the run's attempts (each failed attempt that blamed it)."""
    return strikes([PastAttempt(CauseKind.parse(a.cause), a.blamed_node, False) for a in attempts if a.cause])


def restart_text(attempts: Sequence[Attempt]) -> str:
    """ "restart k of N" for a run the console has relaunched (k: restarts since a person last
    started it), "" for one it has not; what the dashboard header shows."""
    k = 0
    for a in reversed(attempts):
        if a.restarted_by != "recovery":
            break
        k += 1
    if k == 0:
        return ""
    budget = attempts[-1].restart_budget
    return f"restart {k} of {budget}" if budget is not None else f"restart {k}"


def policy_lines(policy: RecoverySection, notify: NotifySection, step_time_s: float | None) -> list[str]:
    """The run's recovery policy in words, as `plan` and the wizard's Review show it."""
    if policy.max_restarts == 0:
        restarts = "no automatic restarts (recovery.max_restarts = 0)"
    else:
        restarts = (
            f"up to {policy.max_restarts} restarts from the newest checkpoint, waiting "
            f"{policy.backoff_s:g} s, doubling to {policy.backoff_max_s:g} s"
        )
    bound = stall_bound_s(policy, step_time_s)
    auto = f" (auto: the larger of {STALL_FLOOR_S:.0f} s and {STALL_STEPS} steps)"
    how = "" if policy.stall_restart_after_s > 0 else auto
    targets = [name for name, on in (("command", notify.command), ("webhook", notify.webhook)) if on]
    return [
        restarts,
        f"a stalled rank is restarted after {bound:.0f} s{how}",
        f"notify: {', '.join(targets) or 'none'}",
        (
            f"a bad node is left out ({policy.exclude_after} strikes; at once if its GPUs fail or it is "
            f"unreachable for {policy.node_lost_after_s:g} s with no step): a spare replaces it, else "
            f"{policy.min_nodes}+ nodes go on"
        ),
    ]
