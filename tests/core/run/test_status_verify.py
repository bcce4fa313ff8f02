"""`taehv-console status RUN --verify`: every checkpoint's bytes against its manifest hashes, through
the real CLI; a same-size corruption is named and the exit status says so."""

from __future__ import annotations

import json

from taehv_console.cli import main
from taehv_console.core.plan.presets import load_preset
from taehv_console.core.plan.render import write_launch_files
from tests.core.watch.test_checkpoints import complete


def test_status_verify_names_a_same_size_corruption(tmp_path, capsys):
    run = tmp_path / "run"
    write_launch_files(load_preset("cpu-smoke", user_dir=None).config, run)
    complete(run / "checkpoints", 2)
    bad = complete(run / "checkpoints", 4)
    assert main(["status", str(run), "--no-check", "--verify", "--json"]) == 0
    assert [v["state"] for v in json.loads(capsys.readouterr().out)["verified"]] == ["complete", "complete"]

    shard = bad / "ds" / "mp_rank_00_model_states.pt"
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0x01  # same size, zip directory intact
    shard.write_bytes(bytes(data))
    assert main(["status", str(run), "--no-check", "--verify", "--json"]) == 1
    out = capsys.readouterr()
    verified = json.loads(out.out)["verified"]
    assert [(v["name"], v["state"]) for v in verified] == [("step-4", "incomplete"), ("step-2", "complete")]
    assert "ds/mp_rank_00_model_states.pt: contents differ" in verified[0]["problems"][0]
    assert "step-4: INCOMPLETE" in out.err
    assert main(["status", str(run), "--no-check", "--json"]) == 0  # without --verify: not read
