"""trainer.hard_exit: a rank leaves without interpreter finalisation (which races gloo's worker
threads) but with everything a normal exit would have done for it."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from trainer.train import EXIT_CONFIG

ROOT = Path(__file__).resolve().parents[2]


def test_exit_now_runs_atexit_flushes_and_skips_finalisation(tmp_path):
    script = textwrap.dedent(
        f"""
        import atexit, logging, pathlib, sys
        from trainer.hard_exit import exit_now
        out = pathlib.Path({str(tmp_path)!r})
        logging.basicConfig(filename=out / "log.txt", level=logging.INFO)
        atexit.register(lambda: (out / "atexit").write_text("ran"))
        class Finalised:  # collected only while the interpreter finalises
            def __del__(self):
                (out / "finalised").write_text("ran")
        keep = Finalised()
        print("buffered on a pipe", end="")  # no newline, no flush
        sys.stderr.write("and on stderr")
        logging.info("logged")
        exit_now(3)
        print("after exit_now")
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert proc.returncode == 3
    assert proc.stdout == "buffered on a pipe" and proc.stderr == "and on stderr"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert "logged" in (tmp_path / "log.txt").read_text()  # logging's own atexit handler flushed it
    assert not (tmp_path / "finalised").exists()  # no finalisation, so nothing for gloo's threads to race


def test_every_rank_and_the_console_script_leave_through_it(tmp_path):
    # accelerate launches `python -m trainer.cli` on every rank (core/plan/render.py) and a user runs
    # taehv-train: both go through entry, which ends in exit_now (main itself still returns)
    (script,) = [
        e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "taehv-train"
    ]
    assert script.value == "trainer.cli:entry"
    # an object that only interpreter finalisation would collect, planted in every process
    (tmp_path / "sitecustomize.py").write_text(
        textwrap.dedent(
            f"""
        import pathlib
        class Finalised:
            def __del__(self):
                pathlib.Path({str(tmp_path / "finalised")!r}).write_text("ran")
        keep = Finalised()
        """
        )
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    run = [sys.executable, "-m", "trainer.cli", "--run", str(tmp_path / "absent")]
    proc = subprocess.run(run, check=False, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == EXIT_CONFIG and "run.toml" in proc.stderr  # main's code comes through
    assert not (tmp_path / "finalised").exists()
    # the control: the same process planted the same way does finalise when it exits normally
    subprocess.run([sys.executable, "-c", "pass"], check=True, cwd=ROOT, env=env, timeout=60)
    assert (tmp_path / "finalised").read_text() == "ran"


def test_a_loader_whose_workers_ignore_sigterm_does_not_hold_the_exit(tmp_path):
    # The loader's workers ignore SIGTERM (trainer.data), and multiprocessing's atexit handler
    # SIGTERMs daemonic children and then joins them with no timeout: an iterator still alive at the
    # end (here held by a reference cycle) kept the process waiting forever (seen in the GPU
    # benchmark's trainer child). exit_now kills them first, with torch's SIGCHLD handler (which
    # raises for a killed worker) out of the way: its error once cut the atexit handlers short and
    # left the worker a zombie, about one exit in two, so three exits are judged.
    script = textwrap.dedent(
        f"""
        import atexit, os, pathlib
        from torch.utils.data import DataLoader
        from trainer.data import _ignore_stop_signals
        from trainer.hard_exit import exit_now

        def init(worker_id):
            _ignore_stop_signals(worker_id)
            pathlib.Path({str(tmp_path)!r}, "worker.pid").write_text(str(os.getpid()))

        atexit.register(lambda: pathlib.Path({str(tmp_path)!r}, "atexit").write_text("ran"))
        class Holder:
            pass
        holder = Holder()
        holder.me = holder
        holder.batches = iter(DataLoader(list(range(8)), batch_size=2, num_workers=1,
                                         persistent_workers=True, worker_init_fn=init))
        print(next(holder.batches).tolist(), flush=True)
        del holder
        exit_now(3)
        """
    )
    for _ in range(3):
        (tmp_path / "atexit").unlink(missing_ok=True)
        proc = subprocess.run(
            [sys.executable, "-c", script], check=False, capture_output=True, text=True, cwd=ROOT, timeout=60
        )
        assert proc.returncode == 3, proc.stderr
        assert proc.stdout.strip() == "[0, 1]" and not proc.stderr
        assert (tmp_path / "atexit").read_text() == "ran"
        worker = int((tmp_path / "worker.pid").read_text())
        assert not Path(f"/proc/{worker}").exists()  # killed and reaped, not left behind
