"""torch's AdamW, without loading the compiler on a rank's start.

torch.optim keeps Dynamo out of its optimizers by wrapping `Optimizer.add_param_group`,
`zero_grad`, `state_dict` and `load_state_dict` in `torch._disable_dynamo`, and `Adam.step` in a
wrapper that breaks Dynamo's graph around it. Both import `torch._dynamo` on their first call: about
1 CPU-s of every rank's start (sympy, torch.fx's symbolic shapes, FSDP's and DTensor's modules), which
an eager run (model.compile off: cpu-smoke, every test run) uses for nothing. The trainer never traces
its optimizers (torch.compile, when on, compiles the model's stages; DeepSpeed calls the optimizer
outside them), so this AdamW calls the same methods with those wrappers taken off: the same update,
bit for bit (tests/trainer/test_optim.py), and the same grad mode in `step` (`differentiable` is
never set: no grad).

DeepSpeed accepts only the optimizer types it lists for ZeRO (`type(optimizer) in ...`, not
isinstance), so the class is added to its list: it is torch's AdamW, with its states, checkpoints and
universal conversion unchanged. A torch whose methods are not wrapped this way (no `__wrapped__`)
gets the methods as they are: slower to start, never wrong.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast, overload

import torch
from deepspeed.runtime.zero import utils as zero_utils
from torch.optim.optimizer import StateDict

Optimizer = torch.optim.Optimizer
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _unwrapped(method: Callable[_P, _R]) -> Callable[_P, _R]:
    # functools.wraps' chain down to torch's own function (Adam.step may also carry the profiler's
    # step hook, once a plain Adam was made in this process: that one is re-added for this class)
    return cast(Callable[_P, _R], inspect.unwrap(method))


_ADD_PARAM_GROUP = _unwrapped(Optimizer.add_param_group)
_ZERO_GRAD = _unwrapped(Optimizer.zero_grad)
_STATE_DICT = _unwrapped(Optimizer.state_dict)
_LOAD_STATE_DICT = _unwrapped(Optimizer.load_state_dict)
_ADAM_STEP = _unwrapped(torch.optim.Adam.step)


class AdamW(torch.optim.AdamW):
    """torch.optim.AdamW, whose methods do not import torch._dynamo (module docstring)."""

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _ADD_PARAM_GROUP(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _ZERO_GRAD(self, set_to_none)

    def state_dict(self) -> StateDict:
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: StateDict) -> None:
        _LOAD_STATE_DICT(self, state_dict)

    @overload
    def step(self, closure: None = None) -> None: ...
    @overload
    def step(self, closure: Callable[[], float]) -> float: ...
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _ADAM_STEP(self, closure)


if AdamW not in zero_utils.ZERO_SUPPORTED_OPTIMIZERS:
    zero_utils.ZERO_SUPPORTED_OPTIMIZERS.append(AdamW)
