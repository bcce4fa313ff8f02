"""One rank of a real DeepSpeed run (torchrun, gloo) that checks trainer.master_weights against the
optimizer's own fp32 master copy; prints one JSON line of findings. Run by test_master_weights."""

from __future__ import annotations

import json
import os
import sys

import deepspeed
import torch
from torch import nn

from trainer.hard_exit import exit_now
from trainer.master_weights import MasterEMA, full_fp32_weights, master_partitions
from trainer.runtime import skip_deepspeed_shm_op


def main() -> None:
    stage, precision = int(sys.argv[1]), sys.argv[2]
    skip_deepspeed_shm_op()  # as the trainer's ranks do
    deepspeed.init_distributed("gloo")
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 3, 3, padding=1))
    conf = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {
            "stage": stage,
            "reduce_bucket_size": 10_000,
            "allgather_bucket_size": 10_000,
            "stage3_param_persistence_threshold": 0,
        },
        "bf16": {"enabled": precision == "bf16"},
    }
    if precision == "bf16":
        conf["data_types"] = {"grad_accum_dtype": "fp32"}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=conf)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    ema = MasterEMA(engine, decay=0.5)
    start = [t.clone() for t in ema.state()]
    for step in range(3):
        x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(step * 10 + rank)).to(dtype)
        loss = (engine(x).float() - x.float()).pow(2).mean()
        engine.backward(loss)
        engine.step()
        ema.update()
    masters = master_partitions(engine)
    # the optimizer's own fp32 copy, by the attribute each ZeRO stage keeps it under
    own = (
        engine.optimizer.single_partition_of_fp32_groups
        if stage < 3
        else engine.optimizer.fp32_partitioned_groups_flat
    )
    full = full_fp32_weights(engine)
    ema_full = ema.full_weights()
    after = full_fp32_weights(engine)
    module_dtypes = sorted({str(p.dtype) for p in engine.module.parameters()})
    out = {
        "rank": rank,
        "module_dtypes": module_dtypes,
        "masters_are_the_optimizers": all(m is o for m, o in zip(masters, own)) and len(masters) == len(own),
        "master_dtypes": sorted({str(m.dtype) for m in masters}),
        "ema_dtypes": sorted({str(t.dtype) for t in ema.state()}),
        "ema_moved": any(not torch.equal(a, b) for a, b in zip(start, ema.state())),
        "full_dtypes": sorted({str(t.dtype) for t in full.values()}),
        "full_shapes_ok": all(
            tuple(full[n].shape) == tuple(s)
            for n, s in (
                (n, p.ds_shape if hasattr(p, "ds_shape") else p.shape)
                for n, p in engine.module.named_parameters()
            )
        ),
        "restored_after_ema": all(torch.equal(full[k], after[k]) for k in full),
        "ema_differs": any(not torch.equal(full[k], ema_full[k]) for k in full),
    }
    # export reads master values, not the module's (bf16) copies: under bf16 they differ in the low bits
    if stage < 3:
        out["export_beats_module_precision"] = any(
            not torch.equal(full[n], p.detach().float().cpu()) for n, p in engine.module.named_parameters()
        )
        flat = torch.cat([full[n].flatten() for n, _ in engine.module.named_parameters()])
        part = own[0].detach().float().cpu()
        # this rank's fp32 partition is its slice of the exported whole (the last rank's is padded)
        start = rank * part.numel()
        piece = flat[start : start + part.numel()]
        out["partition_in_export"] = piece.numel() > 0 and torch.equal(piece, part[: piece.numel()])
    print("PROBE " + json.dumps(out), flush=True)
    # leave as the trainer does (trainer.cli.entry): together, then without interpreter
    # finalisation, which races gloo's worker threads (trainer.hard_exit); a rank that finalised
    # now and then aborted there (SIGABRT), failing a probe whose findings were all printed
    torch.distributed.barrier()
    exit_now(0)


if __name__ == "__main__":
    main()
