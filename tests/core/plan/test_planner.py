"""The planner reproduces the public communication arithmetic and the shape of the public tables."""

from __future__ import annotations

import pytest

from taehv_console.core.plan.planner import (
    bytes_per_optimizer_step,
    comm_fraction,
    compare_plans,
    make_plan,
    parse_bandwidth,
    ring_factor,
    smallest_accumulation,
    usable_bytes_per_s,
)
from taehv_console.core.plan.presets import load_preset

P50 = 50.3e6  # the public example: a 50.3M-parameter model with fp16 gradients
ONE_GBIT = usable_bytes_per_s(parse_bandwidth("1Gbit"))


def test_public_sync_volume_and_time():
    assert ONE_GBIT == 100e6  # "1 Gbps (~100 MB/s usable)"
    assert P50 * 2 == 100.6e6  # fp16 gradients: 100.6 MB
    sync = bytes_per_optimizer_step(P50, 2, None, zero_stage=0, grad_accum=1)
    assert sync == 201.2e6  # moved per sync, 2 x 100.6 MB (ring, large N)
    assert sync / ONE_GBIT == pytest.approx(2.012)  # "2.01 s per sync"
    assert round(sync / ONE_GBIT, 2) == 2.01


@pytest.mark.parametrize("accum, percent", [(1, 67), (4, 33), (8, 20), (16, 11)])
def test_public_comm_fractions_with_one_second_compute(accum, percent):
    sync_s = bytes_per_optimizer_step(P50, 2, None, 0, accum) / ONE_GBIT
    assert round(100 * comm_fraction(sync_s, accum * 1.0)) == percent


def test_public_transfer_for_ten_thousand_steps():
    # 10,000 micro-steps at accumulation 8: 1,250 syncs, 251.5 GB, ~42 minutes of transfer
    syncs = 10_000 // 8
    sync = bytes_per_optimizer_step(P50, 2, None, 0, 8)
    assert syncs == 1250
    assert syncs * sync == pytest.approx(251.5e9, rel=1e-12)
    assert round(syncs * sync / ONE_GBIT / 60) == 42


def test_smallest_accumulation_under_a_target():
    kw = {
        "params": P50,
        "bytes_per_value": 2,
        "world_size": None,
        "compute_s_per_micro_step": 1.0,
        "bytes_per_s": ONE_GBIT,
    }
    # 20.1% at 8 is just above 20%; 9 gives 18.3%
    assert smallest_accumulation(0.20, zero_stage=0, **kw) == 9
    assert smallest_accumulation(0.34, zero_stage=0, **kw) == 4
    # ZeRO-2 reduces gradients on every micro-step: half of 2.01 s per 1 s micro-step never drops
    # below 50%, whatever the accumulation
    assert smallest_accumulation(0.4, zero_stage=2, **kw) is None


def test_ring_and_zero_stage_volumes():
    assert ring_factor(2) == 1.0 and ring_factor(8) == 1.75
    p = 11_315_539
    assert bytes_per_optimizer_step(p, 2, 1, 2, 4) == 0  # one GPU talks to nobody
    s0 = bytes_per_optimizer_step(p, 2, 16, 0, 4)
    assert bytes_per_optimizer_step(p, 2, 16, 1, 4) == s0  # stage 1: same volume as all-reduce
    assert bytes_per_optimizer_step(p, 2, 16, 2, 1) == pytest.approx(s0)  # rs + ag = all-reduce
    assert bytes_per_optimizer_step(p, 2, 16, 2, 4) == pytest.approx(s0 * 5 / 2)
    assert bytes_per_optimizer_step(p, 2, 16, 3, 1) == pytest.approx(s0 * 3 / 2)  # +50% for ZeRO-3


def test_bandwidth_units():
    assert parse_bandwidth("25Gbit") == 25e9
    assert parse_bandwidth("10Gbps") == 10e9
    assert parse_bandwidth("100Gb") == 100e9
    assert parse_bandwidth("2GB/s") == 16e9  # bytes
    assert parse_bandwidth("400") == 400
    for bad in ("fast", "-1Gbit", "0Gbit", "10 parsecs"):
        with pytest.raises(ValueError, match="bandwidth"):
            parse_bandwidth(bad)


def test_8gpu_h100_time_is_this_trainers_and_the_public_trainers_speed_gives_its_111_h():
    """The plan's time comes from this trainer as measured on an H100 (33 clips/s per GPU, compiled,
    channels_last: the presets' settings); at the public project's 4 clips/s the same arithmetic
    gives its published 111 h."""
    from taehv_console.core.plan.throughput import PUBLIC_H100_CLIPS_PER_S

    cfg = load_preset("8gpu-h100", user_dir=None).config
    plan = make_plan(cfg, gpu="H100")
    # 100k steps x 128 clips at 33 clips/s per GPU on one NVLink node: 13.5 h, 108 GPU-hours
    assert plan.time.clips_per_s_per_gpu == 33.0
    assert round(plan.time.hours_to_max_steps, 1) == 13.5 and round(plan.time.gpu_hours) == 108
    assert any("measured: this trainer" in a and "public project's trainer: 4" in a for a in plan.assumptions)
    assert plan.comm.fraction < 0.1 and plan.memory.fits
    public = make_plan(cfg, gpu="H100", clips_per_s_per_gpu=PUBLIC_H100_CLIPS_PER_S)
    assert round(public.time.hours_to_max_steps) == 111 and round(public.time.gpu_hours, -1) == 890
    # the execution settings choose the figure: eager and NCHW are slower
    eager = make_plan(
        cfg.model_copy(update={"model": cfg.model.model_copy(update={"compile": False})}), gpu="H100"
    )
    nchw = make_plan(
        cfg.model_copy(update={"model": cfg.model.model_copy(update={"channels_last": False})}), gpu="H100"
    )
    assert nchw.time.clips_per_s_per_gpu < eager.time.clips_per_s_per_gpu < plan.time.clips_per_s_per_gpu


def test_comparison_table_shape():
    names = ["8gpu-h100", "16gpu-h100", "48gpu-h100", "64gpu-h100"]
    presets = [load_preset(n, user_dir=None) for n in names]
    plans = [
        make_plan(
            p.config, gpu="H100", bandwidth_bits_per_s=parse_bandwidth("25Gbit"), price_per_gpu_hour=2.0
        )
        for p in presets
    ]
    rows = compare_plans(plans, plans[0])
    assert rows[0].speedup == 1.0 and rows[0].relative_cost == 1.0
    speedups = [r.speedup for r in rows]
    assert speedups == sorted(speedups)  # more GPUs, sooner done
    # more GPUs cost more GPU-hours: the public table's 888 < 976 < 1056 < 1088 trend
    hours = [r.plan.time.gpu_hours for r in rows]
    assert hours == sorted(hours)
    assert rows[1].plan.time.cost == pytest.approx(2.0 * rows[1].plan.time.gpu_hours)
    # 16 GPUs do the same 128-clip step in half the compute: speed-up a little under 2x
    assert 1.8 < rows[1].speedup < 2.0


def test_slow_network_shows_in_step_time_and_fraction():
    cfg = load_preset("64gpu-h100", user_dir=None).config
    fast = make_plan(cfg, bandwidth_bits_per_s=parse_bandwidth("100Gbit"))
    slow = make_plan(cfg, bandwidth_bits_per_s=parse_bandwidth("1Gbit"))
    assert slow.comm.seconds_per_step == pytest.approx(100 * fast.comm.seconds_per_step)
    assert slow.comm.fraction > 0.3 > fast.comm.fraction
    assert slow.comm.link == "inter-node 1Gbit"
    # ZeRO-3 at 64 GPUs: 3 x 63/64 x 11.3M x 2 bytes per micro-step
    assert slow.comm.bytes_per_step == pytest.approx(3 * 63 / 64 * 11_315_539 * 2)
