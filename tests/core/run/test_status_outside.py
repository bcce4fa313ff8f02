"""`taehv-console status` on a run no console launched: rendered files only, or a run that trained
from its rendered launch files by hand (`sbatch RUN/sbatch.sh`, taehv-train), which has events and
checkpoints but no state.json. The second used to be reported as "rendered" while it trained."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from taehv_console.cli import main
from taehv_console.commands.status import OUTSIDE
from taehv_console.core.plan.presets import load_preset
from taehv_console.core.plan.render import write_launch_files
from tests.core.watch.test_checkpoints import complete

DONE = Path(__file__).resolve().parents[2] / "fixtures" / "runs" / "cpu-smoke-done"


def _status(run: Path, capsys) -> tuple[int, dict, str]:
    code = main(["status", str(run), "--no-check", "--json"])
    as_json = json.loads(capsys.readouterr().out)
    assert main(["status", str(run), "--no-check"]) == code
    return code, as_json, capsys.readouterr().out


def test_a_run_trained_outside_the_console_shows_its_progress_not_rendered(tmp_path, capsys):
    run = tmp_path / "run"
    write_launch_files(load_preset("cpu-smoke", user_dir=None).config, run)
    code, info, text = _status(run, capsys)
    assert (code, info["phase"]) == (0, "rendered") and "progress" not in info, info
    assert "phase rendered" in text

    # it trained by hand: the ranks' events and a checkpoint, and no console's state.json or lock
    shutil.copytree(DONE / "events", run / "events")
    complete(run / "checkpoints", 40)
    code, info, text = _status(run, capsys)
    steps = [json.loads(line) for line in (DONE / "events" / "rank-0.jsonl").read_text().splitlines()]
    last = max(e["step"] for e in steps if e["kind"] == "step")
    assert code == 0 and info["phase"] == OUTSIDE, info
    assert info["progress"]["step"] == last and info["checkpoint"]["step"] == 40, info
    assert f"phase {OUTSIDE}" in text and f"step {last}/" in text and "newest checkpoint: step 40" in text, (
        text
    )

    # a console's trace (its lock) and no state.json: lost state, an error, not a run outside it
    (run / "lock").touch()
    assert main(["status", str(run), "--no-check"]) == 2
    assert "missing, but a console launched the run" in capsys.readouterr().err
