"""TAEHV.compile_stages: torch.compile over each encoder and decoder stage. Every stage is one graph
(Dynamo reports no break) in both layouts, and the compiled model (inductor on CPU) gives eager's loss
and gradients, and compiles decode() on its own (the teacher-latent path) through the same stages."""

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from trainer.model import TAEHV, reconstruction_target

from .test_model_run_order import _random_weights


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_every_stage_is_one_graph_with_no_break(channels_last):
    torch._dynamo.reset()
    model = TAEHV().train()
    if channels_last:
        model.use_channels_last()
    n = 2  # two videos: the MemBlocks' past frames are per video
    h = torch.rand(n * 4, 3, 16, 16)
    if channels_last:
        h = h.contiguous(memory_format=torch.channels_last)
    stages = model._encoder_stages + model._decoder_stages
    assert len(stages) == 9  # 4 encoder, 4 decoder, and the decoder's per-frame tail
    for i, stage in enumerate(stages):
        explained = torch._dynamo.explain(stage)(h, n)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), (i, explained.break_reasons)
        h = stage(h, n)
    assert h.shape == (n * 4, 3, 16, 16)


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_every_stage_graph_is_one_aotautograds_cache_keeps(channels_last, autocast):
    """A graph AOTAutograd's cache passes over is traced again in every process, however warm the
    caches (benchmarks/compile_cache.py). Two things made it pass over stages: the custom autograd
    functions (torch's default; compile_stages allows them) and, under autocast, the autocast-free
    region around the upsampling (compiled, the pixels are repeated without one)."""
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache, check_cacheable

    torch._dynamo.reset()
    graphs: list[str] = []
    called: set[str] = set()  # what the stages' graphs (and their functions' subgraphs) call

    def backend(gm, _example_inputs):
        called.update(
            str(getattr(n.target, "__name__", n.target)) for m in gm.modules() for n in m.graph.nodes
        )
        try:
            check_cacheable(gm)
            graphs.append("kept")
        except BypassAOTAutogradCache as e:
            graphs.append(str(e).split("\n")[0])
        return gm.forward

    model = TAEHV().train()
    if channels_last:
        model.use_channels_last()
    model.compile_stages(backend=backend)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        model(torch.rand(1, 4, 3, 16, 16), clamp=False)
    assert graphs == ["kept"] * 9, graphs
    # compiled, the upsample repeats pixels (in bf16 under autocast): no float32 interpolate
    assert "expand" in called and not [c for c in called if "interpolate" in c or "upsample" in c], called


def _loss(model: TAEHV, x: torch.Tensor) -> torch.Tensor:
    _z, y = model(x, clamp=False)
    return torch.nn.functional.mse_loss(y, reconstruction_target(x, y.shape[1]))


@pytest.fixture
def one_thread():
    """torch in one thread, as each rank of a 2-process run on a 2-core machine is
    (trainer.runtime sets cores // local ranks)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow  # inductor compiles 9 forward and 9 backward graphs with gcc: ~100 CPU-seconds
@pytest.mark.timeout(900)
def test_compiled_stages_give_eager_loss_and_gradients(one_thread):
    """At the trainer tests' clip size, single-threaded like their ranks: there, Inductor's CPU code
    for a MemBlock's cat written into an `empty` buffer in place (fused with the convolution before
    it) gave NaN from the encoder's third stage on an AVX-512 Xeon, and every loss of a compiled
    run was non-finite (frame_ops.CatPast now builds it functionally when compiled)."""
    torch._dynamo.reset()
    eager = _random_weights(TAEHV()).train()
    compiled = TAEHV().train()
    compiled.load_state_dict(eager.state_dict())
    counter = CompileCounterWithBackend("inductor")
    assert compiled.compile_stages(backend=counter) is compiled
    assert list(compiled.state_dict()) == list(eager.state_dict())  # the published names
    x = torch.rand(1, 8, 3, 32, 32)
    losses, grads = [], []
    for model in (eager, compiled):
        loss = _loss(model, x)
        loss.backward()
        losses.append(loss.detach())
        grads.append({k: p.grad for k, p in model.named_parameters()})
    assert torch.isfinite(losses[1]), losses
    assert counter.frame_count == 9  # each stage compiled once, forward and backward
    assert losses[0] > 0.01
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-6)
    for k in grads[0]:
        torch.testing.assert_close(grads[1][k], grads[0][k], rtol=1e-3, atol=1e-5, msg=k)


class _RunCounter:
    """A Dynamo backend that runs each graph as captured and counts the runs: a stage that fell back
    to eager (a graph break, the recompile limit) runs no graph."""

    def __init__(self):
        self.runs = 0

    def __call__(self, gm, _example_inputs):
        def run(*args):
            self.runs += 1
            return gm(*args)

        return run


def test_decode_on_teacher_latents_validation_and_new_sizes_run_compiled():
    torch._dynamo.reset()
    model = TAEHV().train()
    backend = _RunCounter()
    model.compile_stages(backend=backend)
    x = torch.rand(2, 4, 3, 16, 16)
    z, y = model(x, clamp=False)  # training: grads on
    assert backend.runs == 9
    teacher = torch.randn_like(z)  # the trainer's teacher-latent decode: same shape, no grad of its own
    y_t = model.decode(teacher, clamp=False)
    (y.square().mean() + y_t.square().mean()).backward()
    assert backend.runs == 14  # the decoder's 5 stages ran compiled
    with torch.no_grad():  # validation, at another size: each stage compiles again and runs compiled
        model.decode(torch.randn(1, 2, 16, 3, 3))
        model(torch.rand(1, 8, 3, 24, 32))
    assert backend.runs == 14 + 5 + 9


def test_the_compiled_backward_pools_the_upsample_gradient_instead_of_scattering_it():
    # Autograd's gradient of nearest upsampling compiles to new_zeros + _unsafe_index_put (atomic
    # adds): 31 ms of a 216 ms step on an H100. The model's upsample pools the gradient instead.
    from torch._functorch.aot_autograd import aot_module_simplified

    torch._dynamo.reset()
    backward_ops: list[str] = []

    def record(gm, _example_inputs):
        backward_ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    def backend(gm, example_inputs):
        return aot_module_simplified(
            gm, example_inputs, fw_compiler=lambda g, _e: g.forward, bw_compiler=record
        )

    model = TAEHV().train().use_channels_last()
    model.compile_stages(backend=backend)
    _z, y = model(torch.rand(1, 4, 3, 16, 16), clamp=False)
    y.square().mean().backward()
    assert backward_ops
    assert not [op for op in backward_ops if "index_put" in op]
    assert sum("avg_pool2d" in op for op in backward_ops) == 3  # the decoder's three 2x upsamples


def test_model_compile_mode_reaches_torch_compile_for_every_stage(monkeypatch):
    """model.compile_mode is passed to torch.compile for each stage, with dynamic=False kept, and a
    mode the config does not offer is refused naming the field."""
    from pydantic import ValidationError

    from trainer.config import TrainConfig

    cfg = TrainConfig.model_validate(
        {"model": {"compile": True, "compile_mode": "max-autotune-no-cudagraphs"}}
    )
    asked: list[dict] = []

    def record(fn, *args, **kwargs):
        asked.append(kwargs)
        return fn

    monkeypatch.setattr(torch, "compile", record)
    TAEHV().compile_stages(mode=cfg.model.compile_mode)
    assert asked == [{"mode": "max-autotune-no-cudagraphs", "dynamic": False}] * 9
    with pytest.raises(ValidationError, match="model.compile_mode"):
        TrainConfig.model_validate({"model": {"compile_mode": "reduce-overhead"}})
