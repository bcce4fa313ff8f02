"""The run's compile cache (trainer.compile_cache) at its edges, in this process: where its parts
live, and parts that cannot load. Saving and loading real compiled stages across machines is a
real run's test (tests/trainer/test_speed_options.py)."""

from __future__ import annotations

import torch

from trainer.compile_cache import CACHE_DIR, cache_dir, open_cache


def test_the_cache_is_kept_per_torch_release_and_device_under_the_run(tmp_path):
    folder = cache_dir(tmp_path, torch.device("cpu"))
    assert folder == tmp_path / CACHE_DIR / f"torch-{torch.__version__}-cpu"
    empty = open_cache(tmp_path, torch.device("cpu"), writer=False)
    assert (empty.loaded, empty.error) == (0, None) and not folder.exists()


def test_a_part_that_does_not_load_is_named_and_passed_over(tmp_path):
    from torch._dynamo.utils import counters

    counters.clear()  # what earlier tests of this process compiled is not this test's
    folder = cache_dir(tmp_path, torch.device("cpu"))
    folder.mkdir(parents=True)
    (folder / "part-1.bin").write_bytes(b"half a file")
    (folder / "part-2.bin").write_bytes(b"")
    (folder / "notes.txt").write_text("not a part")
    cache = open_cache(tmp_path, torch.device("cpu"), writer=True)
    assert cache.loaded == 0 and cache.error is not None
    assert f"{folder}/part-1.bin: not a torch" in cache.error and "part-2.bin" in cache.error
    # nothing compiled since, so nothing is written over the parts
    assert not cache.save_new() and sorted(p.name for p in folder.iterdir()) == [
        "notes.txt",
        "part-1.bin",
        "part-2.bin",
    ]


def test_parts_are_written_whole_or_not_at_all(tmp_path):
    """The trainer's atomic write (trainer.events.atomic_write_text), which the cache's parts go
    through: bytes as they are, and a write that fails leaves no temp file behind."""
    from trainer.events import atomic_write_text

    atomic_write_text(tmp_path / "part-1.bin", b"\x00\xffbytes")
    assert (tmp_path / "part-1.bin").read_bytes() == b"\x00\xffbytes"
    (tmp_path / "part-2.bin").mkdir()  # os.replace cannot put a file over a folder
    try:
        atomic_write_text(tmp_path / "part-2.bin", b"data")
    except OSError:
        pass
    else:
        raise AssertionError("a write over a folder did not fail")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-1.bin", "part-2.bin"]
