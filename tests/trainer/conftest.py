"""Fixtures for the trainer tests: a shared set of real synthetic video clips."""

from pathlib import Path

import pytest

from trainer.synthetic import make_synthetic


@pytest.fixture(scope="session")
def clip_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("clips")
    make_synthetic(d, clips=8, frames=12, height=64, width=80, seed=7)
    return d


def save_tiny_teacher(directory: Path, latent_channels: int = 16, seed: int = 0) -> Path:
    """A small randomly initialised HunyuanVideo VAE (the real diffusers class) saved as a user would."""
    import torch
    from diffusers import AutoencoderKLHunyuanVideo

    torch.manual_seed(seed)
    teacher = AutoencoderKLHunyuanVideo(
        block_out_channels=(8, 8, 16, 16),
        layers_per_block=1,
        norm_num_groups=4,
        mid_block_add_attention=False,
        latent_channels=latent_channels,
    )
    teacher.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def teacher_dir(tmp_path_factory) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("teacher"))


def save_tiny_wan(directory: Path, z_dim: int = 16, seed: int = 0) -> Path:
    """A small randomly initialised Wan VAE (diffusers AutoencoderKLWan, the taew2_1 teacher) saved
    as a user would: 8x space, 4x time, z_dim latent channels."""
    import torch
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    AutoencoderKLWan(base_dim=8, z_dim=z_dim, dim_mult=[1, 2, 2, 2], num_res_blocks=1).save_pretrained(
        directory
    )
    return directory


@pytest.fixture(scope="session")
def wan_dir(tmp_path_factory) -> Path:
    return save_tiny_wan(tmp_path_factory.mktemp("wan"))


@pytest.fixture(scope="session")
def tiny_teachers(tmp_path_factory):
    """family -> a directory holding a tiny random teacher of its diffusers class, saved on first use
    (tests/trainer/teachers.py)."""
    from tests.trainer.teachers import TinyTeachers

    return TinyTeachers(tmp_path_factory.mktemp("teachers"))
