"""A run's config for fewer nodes after one is left out: the effective batch kept through
accumulation where it divides, said where it cannot be, the rest of the recipe untouched."""

from __future__ import annotations

import pytest

from taehv_console.core.plan.presets import load_preset
from taehv_console.core.plan.reshape import for_nodes
from trainer.config import config_to_toml, load_config


def test_sixteen_gpus_on_one_node_keep_the_effective_batch_through_accumulation(tmp_path):
    cfg = load_preset("16gpu-h100", user_dir=None).config
    out = for_nodes(cfg, 1)
    new = out.config
    assert (new.topology.nodes, new.topology.world_size) == (1, 8)
    assert new.optim.grad_accum == 2 and new.effective_batch == cfg.effective_batch == 128
    assert new.optim.lr == cfg.optim.lr and new.distributed == cfg.distributed and new.data == cfg.data
    assert out.changes[0].startswith("topology.nodes: 2 -> 1 (world size 16 -> 8)")
    assert "optim.grad_accum: 1 -> 2: keeps the effective batch at 128 clips" in out.changes[1]
    # what the controller writes as run.toml loads as the same config
    (tmp_path / "run.toml").write_text(config_to_toml(new))
    assert load_config(tmp_path / "run.toml") == new


def test_an_effective_batch_that_does_not_divide_is_said_and_the_accumulation_kept():
    cfg = load_preset("48gpu-h100", user_dir=None).config  # 5 per GPU x 48 = 240
    out = for_nodes(cfg, 5)  # 5 x 40 = 200 per accumulation step: 240 does not divide
    assert out.config.optim.grad_accum == cfg.optim.grad_accum
    assert out.config.effective_batch == 200
    assert any(c.startswith("effective batch: 240 -> 200 clips") for c in out.changes), out.changes


@pytest.mark.parametrize("nodes", [0, 2, 3])
def test_only_fewer_nodes_are_a_reshape(nodes):
    cfg = load_preset("16gpu-h100", user_dir=None).config
    with pytest.raises(ValueError, match="cannot be reshaped"):
        for_nodes(cfg, nodes)
