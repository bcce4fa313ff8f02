"""The run's compile cache (trainer.compile_cache) at its edges: where its parts live, parts that
cannot load, what AOTAutograd's cache may keep (fresh processes sharing one Inductor cache), and
when a part is written (fresh processes compiling one small function). Saving and loading the
model's real compiled stages across machines is a real run's test
(tests/trainer/test_speed_options.py)."""

from __future__ import annotations

from pathlib import Path

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


CUSTOM_FUNCTION_CHILD = """
import json, sys
import torch
from torch._dynamo.utils import counters
from trainer.model import cache_custom_autograd_graphs

K = float(sys.argv[1])
if sys.argv[2] == "allow":
    cache_custom_autograd_graphs()


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * K


x = torch.ones(64, requires_grad=True)
torch.compile(lambda x: (Scale.apply(x) + 1).relu().sum(), dynamic=False)(x).backward()
aot = counters["aot_autograd"]
print(json.dumps({"grad": x.grad[0].item(), "hit": aot["autograd_cache_hit"],
                  "miss": aot["autograd_cache_miss"], "bypass": aot["autograd_cache_bypass"]}))
"""


def test_graphs_with_a_custom_autograd_function_are_cached_and_a_changed_backward_is_not_served_stale(
    tmp_path,
):
    """The model's stages hold custom autograd.Functions, which AOTAutograd's cache passes over by
    default; compile_stages lets it keep them (trainer.model.cache_custom_autograd_graphs). Each
    process below compiles the same forward against one Inductor cache: a second process finds the
    graph, and one whose backward differs gets its own backward, not the cached one."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "inductor")

    def run(k: float, allow: bool) -> dict:
        argv = [sys.executable, "-c", CUSTOM_FUNCTION_CHILD, str(k), "allow" if allow else "default"]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    assert run(2, allow=False) == {"grad": 2.0, "hit": 0, "miss": 0, "bypass": 1}  # torch's default
    assert run(2, allow=True) == {"grad": 2.0, "hit": 0, "miss": 1, "bypass": 0}
    assert run(2, allow=True) == {"grad": 2.0, "hit": 1, "miss": 0, "bypass": 0}
    assert run(3, allow=True) == {"grad": 3.0, "hit": 0, "miss": 1, "bypass": 0}


def test_compile_stages_lets_the_cache_keep_custom_autograd_graphs():
    from torch._functorch import config

    from trainer.model import TAEHV

    before = config.autograd_cache_allow_custom_autograd_functions
    try:
        config.autograd_cache_allow_custom_autograd_functions = False
        TAEHV().compile_stages()  # wraps the stages; nothing compiles until they run
        assert config.autograd_cache_allow_custom_autograd_functions is True
    finally:
        config.autograd_cache_allow_custom_autograd_functions = before


RUN_CHILD = """
import json, sys
from pathlib import Path
import torch
from trainer.compile_cache import open_cache

cache = open_cache(Path(sys.argv[1]), torch.device("cpu"), writer=True)
x = torch.ones(64, requires_grad=True)
torch.compile(lambda x: (x * 2 + 1).relu().sum(), dynamic=False)(x).backward()
wrote = [cache.save_new(), cache.save_new()]  # the second finds nothing used since the first
print(json.dumps({**cache.summary(), "wrote": wrote}))
"""


def test_a_run_that_finds_every_graph_on_its_machine_still_fills_its_run_cache(tmp_path):
    """A second run on a node that ran this model before finds every graph in Inductor's cache under
    /tmp and compiles none. Its run's cache must hold them all the same: its first recovery onto a
    fresh machine (empty /tmp) would otherwise compile from cold. A resume that found everything in
    what it loaded adds no part."""
    import json
    import os
    import subprocess
    import sys

    def run(run_dir: Path, inductor: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}
        env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / inductor)
        argv = [sys.executable, "-c", RUN_CHILD, str(run_dir)]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def parts(run_dir: Path) -> list[str]:
        folder = cache_dir(run_dir, torch.device("cpu"))
        return sorted(p.name for p in folder.iterdir()) if folder.exists() else []

    first = run(tmp_path / "first", "node")  # this node's first run: every graph compiled
    assert first["misses"] > 0 and first["wrote"] == [True, False], first
    assert parts(tmp_path / "first") == ["part-1.bin"]

    second = run(tmp_path / "second", "node")  # a new run on the same node: every graph found
    assert (second["loaded"], second["misses"]) == (0, 0) and second["hits"] > 0, second
    assert second["wrote"] == [True, False] and second["saved"] > 0 and second["error"] is None, second
    assert parts(tmp_path / "second") == ["part-1.bin"]

    # its recovery on a fresh machine: every graph from the run's cache, nothing compiled or added
    moved = run(tmp_path / "second", "fresh")
    assert moved["loaded"] >= second["saved"] and moved["hits"] > 0 and moved["misses"] == 0, moved
    assert moved["wrote"] == [False, False] and moved["error"] is None, moved
    assert parts(tmp_path / "second") == ["part-1.bin"]
