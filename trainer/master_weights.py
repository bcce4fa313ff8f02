"""The fp32 master weights DeepSpeed's optimizer updates, for EMA and for exported weights.

Under bf16 the module's parameters are bf16 copies, and under ZeRO-3 each rank holds only a slice
of them: neither is what the optimizer steps. These helpers read the optimizer's own fp32 copy
(this rank's flat partitions for EMA; whole tensors, gathered, for export).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from deepspeed.utils import safe_get_full_fp32_param

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

# Where DeepSpeed's optimizers keep this rank's flat fp32 master partitions: ZeRO-1/2, ZeRO-3,
# and the bf16 optimizer used without ZeRO.
_MASTER_ATTRS = (
    "single_partition_of_fp32_groups",
    "fp32_partitioned_groups_flat",
    "fp32_groups_flat_partition",
)


def master_partitions(engine: DeepSpeedEngine) -> list[torch.Tensor]:
    """This rank's fp32 master weights as the optimizer holds them (flat partitions), or the
    parameters themselves where they are the master copy (fp32 without a ZeRO optimizer)."""
    for attr in _MASTER_ATTRS:
        groups = getattr(engine.optimizer, attr, None)
        if groups:
            return list(groups)
    return [p.data for p in engine.module.parameters()]


def full_fp32_weights(engine: DeepSpeedEngine) -> dict[str, torch.Tensor]:
    """Every parameter whole, in fp32, read from the master weights, on every rank (CPU tensors).

    Collective: every rank must call it (ZeRO-2 all-reduces, ZeRO-3 all-gathers each parameter).
    """

    if hasattr(engine, "empty_partition_cache") and engine.zero_optimization_stage() == 3:
        # params prefetched by the last forward are in flight; settle them before gathering
        engine.empty_partition_cache()
    out = {}
    for name, p in engine.module.named_parameters():
        full = safe_get_full_fp32_param(p)
        if full is None:  # no master copy: the parameter is the fp32 weight itself
            full = p.detach()
        out[name] = full.detach().float().cpu().clone().contiguous()
    return out


class MasterEMA:
    """Exponential moving average of this rank's fp32 master partitions.

    Partitioned like the optimizer state, so an update costs no communication and its checkpoint
    is per rank; `swapped_in` puts it in the master's place to read it out whole.
    """

    def __init__(self, engine: DeepSpeedEngine, decay: float) -> None:
        self.engine = engine
        self.decay = decay
        self.shadow = [t.detach().float().clone() for t in master_partitions(engine)]

    @torch.no_grad()
    def update(self) -> None:
        for avg, w in zip(self.shadow, master_partitions(self.engine)):
            avg.lerp_(w.detach().float(), 1 - self.decay)

    def state(self) -> list[torch.Tensor]:
        return self.shadow

    def load(self, saved: object, where: str) -> None:
        """Restore from state(); `where` names the file in the error when it does not fit."""
        shapes = [tuple(t.shape) for t in self.shadow]
        got = [tuple(t.shape) for t in saved] if isinstance(saved, (list, tuple)) else None
        if got != shapes or not isinstance(saved, (list, tuple)):
            raise ValueError(
                f"{where}: EMA state does not match this run's master partitions ({got} vs {shapes})"
            )
        self.shadow = [t.to(s.device, torch.float32) for t, s in zip(saved, self.shadow)]

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The master weights hold the EMA inside the block, and their own values again after it."""
        masters = master_partitions(self.engine)
        saved = [m.detach().clone() for m in masters]
        try:
            with torch.no_grad():
                for m, avg in zip(masters, self.shadow):
                    m.copy_(avg.to(m.dtype))
            yield
        finally:
            with torch.no_grad():
                for m, s in zip(masters, saved):
                    m.copy_(s)

    def full_weights(self) -> dict[str, torch.Tensor]:
        """The EMA of every parameter, whole, fp32, on every rank (collective)."""
        with self.swapped_in():
            return full_fp32_weights(self.engine)
