"""Cost of checkpoint hashing: seal a ~200 MB checkpoint shaped like a real 2-rank ZeRO-2 one (the
shards are real torch.save archives of random tensors) and time the xxh3-128 hashing that
finalize adds at save and that verify(hashes=True) does before a resume or on `status --verify`.

    .venv/bin/python benchmarks/checkpoint_hash.py [--mb 200] [--repeat 3]

Files are read from the page cache (just written), as at save time; a resume on a cold cache is
bound by the disk, not by the hash.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build(tmp: Path, mb: int) -> None:
    import torch
    from safetensors.torch import save_file

    from trainer import checkpoint as ckpt

    names = [alts[0] for alts in ckpt.required_files(2, 2)]
    pt = [n for n in names if n.endswith(".pt")]
    per_file = mb * 2**20 // (len(pt) + 1) // 4  # float32 elements
    for n in names:
        p = tmp / n
        p.parent.mkdir(parents=True, exist_ok=True)
        if n.endswith(".pt"):
            torch.save({"w": torch.randn(per_file)}, p)
        elif n.endswith(".safetensors"):
            save_file({"w": torch.randn(per_file)}, str(p))
        else:
            p.write_text('{"step": 1}')


def main() -> None:
    from trainer import checkpoint as ckpt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckpt-hash-") as d:
        root = Path(d)
        save_s, verify_s, nbytes = [], [], 0
        for i in range(args.repeat):
            tmp = root / f"step-{i}.tmp"
            build(tmp, args.mb)
            nbytes = sum(p.stat().st_size for p in tmp.rglob("*") if p.is_file())
            t0 = time.perf_counter()
            for p in sorted(tmp.rglob("*")):
                if p.is_file():
                    ckpt.file_hash(p)  # what finalize adds to a save
            save_s.append(time.perf_counter() - t0)
            final = ckpt.finalize(tmp, i, 2, 2)
            t0 = time.perf_counter()
            assert ckpt.verify(final, hashes=True).ok
            verify_s.append(time.perf_counter() - t0)
            shutil.rmtree(final)
    mb = nbytes / 2**20
    s, v = statistics.median(save_s), statistics.median(verify_s)
    print(f"checkpoint: {mb:.0f} MB in {len(ckpt.required_files(2, 2))} files, {ckpt.HASH_ALGO}")
    print(f"hash at save:   {s:.3f} s  {mb / s:,.0f} MB/s  ({s / mb * 1024:.2f} s per GB)")
    print(
        f"verify (hashes, sizes, zip directories): {v:.3f} s  {mb / v:,.0f} MB/s  ({v / mb * 1024:.2f} s per GB)"
    )


if __name__ == "__main__":
    main()
