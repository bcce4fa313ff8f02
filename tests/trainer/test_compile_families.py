"""The compiled path of the families whose layers differ from taehv's: the super decoder
(SuperMemBlock, PixelShuffle, no Clamp), patch 2 and 4 (pixel unshuffle in, shuffle out), LTX's 8x
time and H3's chunked encoder. Each stage is one graph with no break, in both layouts, and the model
compiled per stage through Dynamo and AOTAutograd (forward and backward traced, the custom autograd
functions kept) gives eager's loss and gradients. The backend is aot_eager: Inductor's C++ code for
the same graphs is what test_compile.py and the compiled runs cover for taehv, and the graphs are
what differs per family."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from trainer.families import FAMILIES
from trainer.model import TAEHV, reconstruction_target

from .test_model_run_order import _random_weights

# each layout once across the cases (every stage's graph in both layouts is test_compile.py's, for
# taehv's layers): the super decoder in the GPU presets' channels_last, LTX's patch 4 and 8x time in
# NCHW, H3's chunks in channels_last. taehv1_5_super is taew2_2_super's decoder at other widths.
CASES = [("taew2_2_super", True), ("taeltx_2", False), ("taeh3", True)]


def _clip(family: str) -> torch.Tensor:
    fam = FAMILIES[family]
    frames = fam.chunks.frames if fam.chunks else 2 * fam.time_scale
    side = 2 * fam.space_scale
    return torch.rand(1, frames, 3, side, side)


def _loss(model: TAEHV, x: torch.Tensor) -> torch.Tensor:
    _z, y = model(x, clamp=False)
    return torch.nn.functional.mse_loss(y, reconstruction_target(x, y.shape[1]))


@pytest.mark.parametrize(
    ("family", "channels_last"), CASES, ids=[f"{f}-{'cl' if c else 'nchw'}" for f, c in CASES]
)
def test_each_familys_stages_compile_to_one_graph_each_with_eagers_loss_and_gradients(family, channels_last):
    torch._dynamo.reset()
    torch.manual_seed(0)
    eager = _random_weights(TAEHV.for_family(family)).train()
    if channels_last:
        eager.use_channels_last()
    compiled = copy.deepcopy(eager)
    counter = CompileCounterWithBackend("aot_eager")
    compiled.compile_stages(backend=counter)
    x = _clip(family)

    want = _loss(eager, x)
    want.backward()
    got = _loss(compiled, x)
    got.backward()

    stages = len(compiled._encoder_stages) + len(compiled._decoder_stages)
    # one graph per stage: a graph break would add frames, a stage left eager would add none
    assert counter.frame_count == stages, (counter.frame_count, stages)
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got.item(), want.item())
    grads = [(n, p.grad, q.grad) for (n, p), q in zip(eager.named_parameters(), compiled.parameters())]
    assert all(g is not None and h is not None for _, g, h in grads)
    worst = max(((h - g).abs().max() / g.abs().max().clamp_min(1e-12)).item() for _, g, h in grads)
    assert worst < 1e-4, worst
    if FAMILIES[family].super_decoder:
        kinds = {type(m).__name__ for m in compiled.decoder.modules()}
        assert {"SuperMemBlock", "PixelShuffle"} <= kinds and "Clamp" not in kinds, kinds
