"""Colour jitter on the device against the CPU jitter it replaced: the same distribution of effects
(brightness, contrast, saturation, hue) over many clips, and the same output for the same factors.
The CPU path is kept here as the reference, as trainer/data.py had it before the move."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.augment import NO_JITTER, jitter_factors, to_model_input
from trainer.config import DataSection
from trainer.data import VideoClipDataset
from trainer.synthetic import make_synthetic

LUMA = (0.299, 0.587, 0.114)
STRENGTH = 0.2
N = 400  # clips per population: quantiles then sit within ~0.01 of the truth for uniform factors


def old_cpu_jitter(clip_u8: torch.Tensor, seed: int, strength: float) -> torch.Tensor:
    """The loader's jitter before it moved (trainer/data.py at bf10476): factors from the item's
    generator after the crop's four draws, applied to float frames in [0, 255], rounded to uint8."""
    rng = np.random.default_rng([seed, 1])
    rng.uniform(0.6, 1.0), rng.integers(0, 1), rng.integers(0, 1), rng.random()  # scale, top, left, flip
    brightness, contrast, saturation = rng.uniform(1 - strength, 1 + strength, 3)
    x = clip_u8.float()
    luma = torch.tensor(LUMA).view(1, 3, 1, 1)
    x = x * float(brightness)
    pivot = float(np.mean((x * luma).sum(1).numpy(), dtype=np.float64))
    x = (x - pivot) * float(contrast) + pivot
    grey = (x * luma).sum(1, keepdim=True)
    x = (x - grey) * float(saturation) + grey
    return x.round_().clamp_(0, 255).to(torch.uint8)


def effects(before: torch.Tensor, after: torch.Tensor) -> dict[str, float]:
    """What a jitter did to one clip (both [T, 3, H, W] in [0, 1])."""
    luma = torch.tensor(LUMA, dtype=torch.float64).view(1, 3, 1, 1)

    def stats(x):
        x = x.double()
        y = (x * luma).sum(1)
        chroma = x - y[:, None]
        # hue as the angle of the opponent-colour vector (R-G, (R+G)/2-B), averaged as a vector
        a = (x[:, 0] - x[:, 1]).mean()
        b = ((x[:, 0] + x[:, 1]) / 2 - x[:, 2]).mean()
        return y.mean(), y.std(), chroma.abs().mean(), torch.atan2(b, a)

    m0, s0, c0, h0 = stats(before)
    m1, s1, c1, h1 = stats(after)
    dh = float(torch.remainder(h1 - h0 + torch.pi, 2 * torch.pi) - torch.pi)
    return {"brightness": float(m1 / m0), "contrast": float(s1 / s0), "saturation": float(c1 / c0), "hue": dh}


@pytest.fixture(autouse=True)
def one_thread():
    # Thousands of ops on tiny tensors: a thread pool only adds wake-ups (seconds on a busy machine).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    paths = make_synthetic(tmp_path_factory.mktemp("jitter"), clips=4, frames=8, height=48, width=64, seed=3)
    cfg = DataSection(frames=8, height=32, width=48, color_jitter=STRENGTH, num_workers=0, flip=False)
    ds = VideoClipDataset(paths, cfg, train=True)
    return ds, [ds[(i, 10_000 + i)]["video"] for i in range(len(paths))]


def test_device_jitter_matches_the_cpu_jitter_in_distribution(clips):
    ds, videos = clips
    old, new = {}, {}
    for k in range(N):
        clip = videos[k % len(videos)]
        plain = clip.float() / 255
        # disjoint seeds: the two populations are independent samples of each path
        before_cpu = old_cpu_jitter(clip, seed=k, strength=STRENGTH).float() / 255
        # the factors the dataset draws for an item (decoding 400 clips would add nothing here)
        _box, factors = ds.augmentation(48, 64, seed=N + k)
        after_dev = to_model_input(clip[None], torch.float32, torch.tensor([factors]))[0]
        for name, value in effects(plain, before_cpu).items():
            old.setdefault(name, []).append(value)
        for name, value in effects(plain, after_dev).items():
            new.setdefault(name, []).append(value)
    qs = [0.05, 0.25, 0.5, 0.75, 0.95]
    for name in ("brightness", "contrast", "saturation"):
        a, b = np.array(old[name]), np.array(new[name])
        assert a.std() > 0.05, f"{name}: the reference jitter should spread it"
        assert abs(a.mean() - b.mean()) < 0.02, f"{name}: means {a.mean():.4f} vs {b.mean():.4f}"
        assert abs(a.std() - b.std()) < 0.02, f"{name}: stds {a.std():.4f} vs {b.std():.4f}"
        qa, qb = np.quantile(a, qs), np.quantile(b, qs)
        assert np.abs(qa - qb).max() < 0.04, f"{name}: quantiles {qa.round(3)} vs {qb.round(3)}"
    # Neither path turns hues (saturation scales chroma around each pixel's grey); only clipping at
    # black and white bends them a little, the same in both.
    a, b = np.abs(old["hue"]), np.abs(new["hue"])
    assert np.median(a) < 0.01 and np.median(b) < 0.01
    assert abs(np.quantile(a, 0.9) - np.quantile(b, 0.9)) < 0.01, (np.quantile(a, 0.9), np.quantile(b, 0.9))


def test_a_decoded_item_carries_the_factors_its_seed_draws(clips):
    ds, _ = clips
    for seed in (1, 2, 3):
        item = ds[(0, seed)]
        _box, factors = ds.augmentation(48, 64, seed)
        assert item["jitter"].tolist() == pytest.approx(list(factors))
        assert all(1 - STRENGTH <= f <= 1 + STRENGTH for f in factors)


def test_same_factors_give_the_cpu_output_within_rounding(clips):
    _, videos = clips
    for k in range(20):
        clip = videos[k % len(videos)]
        rng = np.random.default_rng([k, 1])
        rng.uniform(0.6, 1.0), rng.integers(0, 1), rng.integers(0, 1), rng.random()
        factors = torch.tensor([jitter_factors(rng, STRENGTH)])
        expected = old_cpu_jitter(clip, seed=k, strength=STRENGTH).float() / 255
        got = to_model_input(clip[None], torch.float32, factors)[0]
        # the CPU path rounded to whole levels; the device path keeps the fraction
        assert (got - expected).abs().max() <= 0.5 / 255 + 1e-5


def test_no_jitter_is_plain_scaling_and_batches_are_per_clip():
    x = torch.randint(0, 256, (2, 4, 3, 8, 8), dtype=torch.uint8)
    plain = to_model_input(x, torch.float32)
    assert torch.equal(plain, x.float() / 255)
    assert torch.allclose(
        to_model_input(x, torch.float32, torch.tensor([NO_JITTER, NO_JITTER])), plain, atol=1e-6
    )
    # each clip gets its own row: jittering clip 0 leaves clip 1 alone
    mixed = to_model_input(x, torch.float32, torch.tensor([[1.2, 0.8, 1.1], list(NO_JITTER)]))
    assert not torch.allclose(mixed[0], plain[0]) and torch.allclose(mixed[1], plain[1], atol=1e-6)
    assert to_model_input(x, torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"\[2, 3\]"):
        to_model_input(x, torch.float32, torch.ones(3))
    assert jitter_factors(np.random.default_rng(0), 0.0) == NO_JITTER
