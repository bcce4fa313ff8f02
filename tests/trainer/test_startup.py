"""A rank's start: what it loads before its first step (benchmarks/smoke_start.py measures it)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.trainer.runs import free_port

# One rank's ZeRO-2 engine and step, as the trainer makes them (accelerate's prepare with the
# runtime's DeepSpeed settings): DeepSpeed's ZeRO optimizer check and its gradient reduction both
# import the Muon module
STEP = textwrap.dedent(
    """
    import os, sys
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1], DS_ACCELERATOR="cpu")
    import torch, deepspeed
    from accelerate import Accelerator
    from trainer.optim import AdamW
    from trainer.runtime import (DEEPSPEED_MUON, DeepSpeedSettings, import_deepspeed_muon_lazily,
                                 skip_deepspeed_shm_op)
    assert import_deepspeed_muon_lazily()
    assert skip_deepspeed_shm_op()
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    deepspeed.init_distributed(dist_backend="gloo")
    print("shm-op", deepspeed.comm.comm.cdb.shm_comm_op)
    model = torch.nn.Linear(4, 4)
    config = {"train_batch_size": 1, "train_micro_batch_size_per_gpu": 1,
              "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedSettings(hf_ds_config=config))
    engine, _ = accelerator.prepare(model, AdamW(model.parameters(), fused=True))
    before = model.weight.detach().clone()
    engine.backward(engine(torch.ones(1, 4)).sum())
    engine.step()
    # what a checkpoint and a resume call: DeepSpeed's ZeRO state reads the AdamW's, which loads it back
    engine.optimizer.state_dict()
    engine.optimizer.optimizer.load_state_dict(engine.optimizer.optimizer.state_dict())
    engine.optimizer.zero_grad()
    muon = sys.modules[DEEPSPEED_MUON]
    print("zero-optimizer", type(engine.optimizer).__name__)
    print("moved", not torch.equal(before, model.weight.detach()))
    print("inductor", "torch._inductor.compile_fx" in sys.modules)
    print("muon", hasattr(muon, "MuonWithAuxAdam"))
    print("transformers", "transformers" in sys.modules)
    print("dynamo", "torch._dynamo" in sys.modules)
    """
)


def test_a_zero2_step_loads_deepspeeds_muon_module_but_not_inductor_transformers_or_dynamo():
    # the Muon module decorates its functions with torch.compile, whose decoration loads all of
    # Inductor: 1-2.5 s of every eager rank's start (trainer/runtime.py: import_deepspeed_muon_lazily)
    done = subprocess.run(
        [sys.executable, "-c", STEP, str(free_port())], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    said = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    assert said.get("zero-optimizer") == "DeepSpeedZeroOptimizer", done.stdout
    assert said.get("moved") == "True", done.stdout
    assert said.get("muon") == "True", done.stdout
    assert said.get("inductor") == "False", done.stdout
    # nor does it build DeepSpeed's CPU shm op (~50 CPU-s of g++ on a machine's first run), which
    # only DeepSpeed's inference all-reduce uses: training reduces through gloo
    assert said.get("shm-op") == "None", done.stdout
    assert "deepspeed_shm_comm" not in done.stdout + done.stderr, done.stdout + done.stderr
    # nor transformers, which accelerate's own DeepSpeed plugin imports (~0.9 s of each rank's start)
    # for transformers' from_pretrained, which the trainer never calls (runtime.DeepSpeedSettings)
    assert said.get("transformers") == "False", done.stdout
    # nor torch._dynamo, which torch.optim's own AdamW imports in its first call (~1 CPU-s) only to
    # keep the compiler out of it (trainer/optim.py)
    assert said.get("dynamo") == "False", done.stdout
