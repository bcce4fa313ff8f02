"""Fault injection for tests and drills, read from TAEHV_FAULTS; inert when the variable is unset.

Spec: comma-separated `kind:rank:step[:seconds]`, step `*` for every step. Kinds:
  nan        - this rank's loss becomes NaN once at that step: its first micro-batch (tests the
               collective skip; the retried micro-batch is finite)
  delay      - sleep before the step's forward pass (a straggler)
  stall      - sleep before the step's first collective (tests the collective timeout)
  ckpt_sleep - sleep after writing this rank's checkpoint files, before the barrier
               (a window in which a test kills a rank mid-checkpoint)
  raise      - raise a ValueError before the step's forward pass: a trainer bug, which a
               restart would meet again (tests that the console does not restart it)
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int | None  # None = every step
    seconds: float = 0.0


KINDS = ("nan", "delay", "stall", "ckpt_sleep", "raise")


def parse_faults(spec: str) -> list[Fault]:
    faults = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        bits = part.split(":")
        if len(bits) not in (3, 4) or bits[0] not in KINDS:
            raise ValueError(
                f"TAEHV_FAULTS: cannot read {part!r}; expected kind:rank:step[:seconds], kind in {KINDS}"
            )
        step = None if bits[2] == "*" else int(bits[2])
        faults.append(Fault(bits[0], int(bits[1]), step, float(bits[3]) if len(bits) == 4 else 0.0))
    return faults


class FaultPlan:
    def __init__(self, rank: int, spec: str | None = None):
        spec = os.environ.get("TAEHV_FAULTS", "") if spec is None else spec
        self.rank = rank
        self.faults = [f for f in parse_faults(spec) if f.rank == rank]
        self._fired: set[tuple[str, int]] = set()

    def _match(self, kind: str, step: int) -> Fault | None:
        for f in self.faults:
            if f.kind == kind and (f.step is None or f.step == step):
                return f
        return None

    def nan_loss(self, step: int) -> bool:
        if self._match("nan", step) is None or ("nan", step) in self._fired:
            return False
        self._fired.add(("nan", step))
        return True

    def maybe_raise(self, step: int) -> None:
        if self._match("raise", step) is not None:
            raise ValueError(f"TAEHV_FAULTS: injected error at step {step} on rank {self.rank}")

    def sleep(self, kind: str, step: int) -> None:
        f = self._match(kind, step)
        if f and f.seconds > 0:
            time.sleep(f.seconds)
