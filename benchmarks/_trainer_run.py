"""What the benchmarks share to run the trainer's real `train_step` in this process: a temporary run
(synthetic clips and a run.toml) built into a `Trainer` exactly as `taehv-train` builds one, and
`SyncCounter`, which counts host reads of device values by hooking the calls that make them.

Used by benchmarks/host_syncs.py (on CPU) and benchmarks/gpu_throughput.py's trainer mode (on a GPU
or CPU). A Trainer owns the process group: build one per process.
"""

from __future__ import annotations

import collections
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

from trainer.config import load_config
from trainer.runtime import Runtime
from trainer.state import TrainState
from trainer.synthetic import make_synthetic
from trainer.train import Trainer


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def write_run(
    tmp: Path,
    zero: int,
    grad_accum: int,
    steps: int,
    frames: int = 8,
    height: int = 64,
    width: int = 64,
    clips: int = 4,
    extra: dict[str, Any] | None = None,
    source_frames: int | None = None,
) -> Path:
    """A run directory under `tmp` over `clips` synthetic videos (of `source_frames`, by default a
    clip's `frames`), with no log, validation or checkpoint inside `steps` optimizer steps. `extra` overrides any
    run.toml key by section, e.g. {"topology": {"device": "cuda"}, "model": {"compile": True}}."""
    source = tmp / "clips"
    make_synthetic(source, clips=clips, frames=source_frames or frames, height=height, width=width, seed=0)
    run = tmp / "run"
    run.mkdir()
    cfg = {
        "run": {"preset": "bench", "seed": 0},
        "topology": {"nodes": 1, "gpus_per_node": 1, "device": "cpu"},
        "data": {"source": str(source), "frames": frames, "height": height, "width": width, "num_workers": 0},
        "optim": {"batch_per_gpu": 1, "grad_accum": grad_accum, "max_steps": 10 * steps, "warmup_steps": 0},
        "deepspeed": {"zero_stage": zero},
        "schedule": {"log_every": 10**6, "val_every": 10**6, "checkpoint_every": 10**6},
    }
    (run / "run.toml").write_text(tomli_w.dumps(_merged(cfg, extra or {})))
    return run


def build_trainer(run: Path) -> Trainer:
    """The trainer of `run`, as `taehv-train --run RUN` builds it (no teacher, no latent cache)."""
    config = load_config(run / "run.toml")
    return Trainer(Runtime.start(run, config), config, TrainState())


class SyncCounter:
    """Counts hooked calls by (phase, owner, call site) while `active`: `Tensor.item`, `.tolist`,
    `bool()`, `.cpu()` and host-to-device tensor creation (`torch.tensor`/`torch.as_tensor` with a
    `device=`). On a GPU each is a point where the host waits for the device."""

    def __init__(self) -> None:
        self.active = False
        self.phase = "outside"  # "between" from a micro-batch's loss to its backward
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._inside = False
        self._saved: list[tuple[Any, str, Any]] = []

    def _site(self) -> tuple[str, str]:
        frames = traceback.extract_stack()[:-2]  # less this frame and the hook
        for owner, marker in (("deepspeed", "/deepspeed/"), ("trainer", "/trainer/")):
            for f in reversed(frames):
                if marker in f.filename and "benchmarks/" not in f.filename:
                    where = f"{Path(f.filename).name}:{f.lineno} {f.name}"
                    if owner == "deepspeed" or not any("/deepspeed/" in g.filename for g in frames):
                        return owner, where
        return "other", frames[-1].name if frames else "?"

    def _wrap(
        self, fn: Callable[..., Any], what: str, only: Callable[..., bool] | None = None
    ) -> Callable[..., Any]:
        def hooked(*args: Any, **kwargs: Any) -> Any:
            if self.active and not self._inside and (only is None or only(*args, **kwargs)):
                self._inside = True
                try:
                    owner, where = self._site()
                    self.counts[(self.phase, owner, f"{what} at {where}")] += 1
                finally:
                    self._inside = False
            return fn(*args, **kwargs)

        return hooked

    def install(self) -> None:
        for name in ("item", "tolist", "__bool__", "cpu"):
            self._patch(torch.Tensor, name, name)
        on_device = lambda *a, **k: k.get("device") is not None
        self._patch(torch, "tensor", "H2D torch.tensor", on_device)
        self._patch(torch, "as_tensor", "H2D torch.as_tensor", on_device)

    def _patch(self, owner: Any, name: str, what: str, only: Callable[..., bool] | None = None) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, self._wrap(original, what, only))

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()

    def track_phases(self, trainer: Trainer) -> None:
        """Mark "between" from each micro-batch's loss to its backward on `trainer`."""
        loss, engine = trainer.loss, trainer.learner.engine
        backward = engine.backward

        def loss_then_between(*a: Any, **k: Any) -> Any:
            out = loss(*a, **k)
            self.phase = "between"
            return out

        def backward_then_outside(*a: Any, **k: Any) -> Any:
            self.phase = "outside"
            return backward(*a, **k)

        trainer.loss = loss_then_between  # type: ignore[assignment]
        engine.backward = backward_then_outside

    def per_step(self, steps: int) -> dict[tuple[str, str, str], float]:
        return {k: v / steps for k, v in self.counts.items()}

    def totals(self, steps: int) -> dict[str, float]:
        """trainer_per_step, between_forward_and_backward, deepspeed_per_step and <owner>_<phase>."""
        per = self.per_step(steps)
        by: collections.defaultdict[str, float] = collections.defaultdict(float)
        for (phase, owner, _site), n in per.items():
            by[f"{owner}_{phase}"] += n
        return {
            "trainer_per_step": round(sum(n for (_p, o, _s), n in per.items() if o == "trainer"), 3),
            "between_forward_and_backward": round(
                sum(n for (p, _o, _s), n in per.items() if p == "between"), 3
            ),
            "deepspeed_per_step": round(sum(n for (_p, o, _s), n in per.items() if o == "deepspeed"), 3),
            **{k: round(v, 3) for k, v in sorted(by.items())},
        }
