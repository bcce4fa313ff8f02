"""trainer.optim.AdamW is torch's AdamW: the same updates, states and checkpoints, bit for bit (that
it leaves torch._dynamo unloaded is tests/trainer/test_startup.py's, in a fresh process)."""

from __future__ import annotations

import pytest
import torch
from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

from trainer.optim import AdamW


def _model_and_groups(seed: int) -> tuple[torch.nn.Module, list[dict]]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.GroupNorm(2, 8), torch.nn.Conv2d(8, 4, 1))
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    return model, [{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}]


def _train(opt_cls: type[torch.optim.Optimizer], steps: int, state: dict | None = None, fused: bool = False):
    model, groups = _model_and_groups(0)
    opt = opt_cls(groups, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    if state is not None:
        opt.load_state_dict(state)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(2, 3, 9, 9, generator=gen)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        assert all(p.grad is None for p in model.parameters())
    return model, opt


@pytest.mark.parametrize("fused", [False, True], ids=["default", "fused"])  # the trainer's: fused
def test_the_same_updates_and_state_as_torchs_adamw(fused):
    ours, ours_opt = _train(AdamW, 4, fused=fused)
    torchs, torchs_opt = _train(torch.optim.AdamW, 4, fused=fused)
    for a, b in zip(ours.parameters(), torchs.parameters(), strict=True):
        assert torch.equal(a, b)
    a_state, b_state = ours_opt.state_dict(), torchs_opt.state_dict()
    assert a_state["param_groups"] == b_state["param_groups"]
    assert a_state["state"].keys() == b_state["state"].keys() and a_state["state"]
    for k, v in a_state["state"].items():
        assert v.keys() == b_state["state"][k].keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert all(torch.equal(v[name], b_state["state"][k][name]) for name in v)


def test_a_state_saved_by_either_loads_into_the_other():
    # torch's default (what checkpoints before the fused kernel hold) and the trainer's fused one
    _, torchs_opt = _train(torch.optim.AdamW, 2)
    _, ours_opt = _train(AdamW, 2, fused=True)
    # each resumes from the other's state: the moments and step counts are taken, not restarted
    resumed, resumed_opt = _train(AdamW, 1, state=torchs_opt.state_dict(), fused=True)
    assert all(int(s["step"]) == 3 for s in resumed_opt.state_dict()["state"].values())
    back, back_opt = _train(torch.optim.AdamW, 1, state=ours_opt.state_dict())
    assert all(int(s["step"]) == 3 for s in back_opt.state_dict()["state"].values())
    # the fused kernel and the default order their float operations differently: equal to rounding
    for a, b in zip(resumed.parameters(), back.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_deepspeed_takes_it_for_zero():
    # DeepSpeed's ZeRO check is by exact type: without this, "You are using an untested ZeRO Optimizer"
    assert AdamW in ZERO_SUPPORTED_OPTIMIZERS
