"""The trainer's imports sit at module top, as the console's do (tests/core/test_lazy_imports.py),
except in the places listed here, each with why it is lazy. A new function-level import fails this
test until it is listed with a reason; a listed one that is gone must leave the list."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.core.test_lazy_imports import function_level_imports

ROOT = Path(__file__).resolve().parents[2]

CLI_FAST = "`taehv-train make-synthetic`/`--help` start without torch, DeepSpeed and accelerate"
# (file, imported module) -> why it is imported inside a function
LAZY: dict[tuple[str, str], str] = {
    ("trainer/cli.py", "trainer.train"): CLI_FAST,
    ("trainer/cli.py", "trainer.bench_data"): CLI_FAST,
    ("trainer/cli.py", "trainer.config"): CLI_FAST,
    ("trainer/cli.py", "trainer.data"): CLI_FAST,
    ("trainer/cli.py", "trainer.synthetic"): CLI_FAST,
    ("trainer/cli.py", "trainer.latent_cache"): CLI_FAST,
    # the console imports these modules at its start-up, which must not import torch (or tomli_w's
    # writer where only reading is needed)
    ("trainer/config.py", "tomli_w"): "the console reads configs at start-up; writing one is rarer",
    ("trainer/ds_config.py", "deepspeed.runtime.zero"): "the console builds DeepSpeed configs without torch",
    ("trainer/model.py", "safetensors.torch"): "only where weights are read from a file",
    ("trainer/model.py", "safetensors"): "only where a weight file's metadata is read",
    ("trainer/compile_cache.py", "torch._dynamo.utils"): "a second's import; only compiled runs count graphs",
    # optional extras: a run that does not use them must not need them installed
    ("trainer/synthetic.py", "skimage.data"): "the `photos` extra, only for --photos clips",
    ("trainer/synthetic.py", "scipy.ndimage"): "scikit-image's dependency, only for --photos clips",
    ("trainer/teacher.py", "diffusers"): "the `teacher` extra (~2 s), only when a run distils online",
    ("trainer/teacher_geometry.py", "diffusers"): "the config schema reads teachers' config.json without "
    "torch; only a config.json that leaves out a key the geometry needs asks diffusers for its default",
}


def test_trainer_imports_inside_functions_are_only_the_listed_ones():
    found = function_level_imports(ROOT, "trainer")
    unlisted = sorted(found - LAZY.keys())
    assert not unlisted, (
        f"imports inside functions: move them to the module's top, or list them with a reason: {unlisted}"
    )
    gone = sorted(LAZY.keys() - found)
    assert not gone, f"listed as lazy but no longer imported inside a function: {gone}"


def test_taehv_train_help_starts_without_torch():
    code = (
        "import sys\nsys.argv = ['taehv-train', '--help']\nfrom trainer import cli\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'deepspeed', 'accelerate') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "[]"
