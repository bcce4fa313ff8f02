"""A stand-in for one node's `accelerate launch` in controller tests: it behaves like torchrun
where control depends on it, at no DeepSpeed cost.

- starts `--ranks` rank processes, each in a session of its own (torchrun does the same);
- each rank writes the trainer's events (start, step every --step-s, checkpoint, stop) and
  heartbeats into RUN; a stop request (SIGTERM) finishes the step, checkpoints through the trainer's
  own protocol (each rank its files in step-N.tmp, rank 0 finalizes once all are there: a real,
  verifiable checkpoint of stand-in bytes) and writes `stop` (reason signal), exit 0; at
  --max-steps it stops with reason done;
- ranks keep step as the trainer's do (every step ends in an all-reduce): a rank behind its peers'
  heartbeats, e.g. one that was SIGSTOPped while they went on, runs its steps without sleeping
  until it has caught up, so the stop's agreed step is one every rank reaches together;
- the launcher forwards SIGTERM to every rank's group and exits 1 afterwards (torchrun's
  SignalException), or 0 when the ranks finished on their own;
- when a rank dies it prints torchelastic's "Root Cause (first observed failure)" block, kills
  the other ranks and exits 1.
Options by environment for odd cases: FAKE_IGNORE_TERM=1 (ranks ignore SIGTERM: SIGKILL needed),
FAKE_FAIL_AT=rank:step (that rank raises an error at that step), FAKE_STOP_FILE=path (every rank
stops once it exists: the trainer's collective stop agreement, across consoles), FAKE_SLOW_STOP=
rank:seconds (that rank says `stop` late, as rank 0 does while it finalizes the checkpoint),
FAKE_SAVE_FAIL=1 (the save fails, e.g. on a full disk: nothing is published, yet every rank still
says `stop` at its step, as the trainer does), FAKE_CKPT_EVERY=n (every rank checkpoints every n
steps, as schedule.checkpoint_every), FAKE_LINGER=node:seconds (that node's launcher waits this long
after its ranks have exited, as torchrun's exit barrier does), FAKE_DIE_AT=rank:step (that rank SIGKILLs itself on reaching
that step, on every attempt: a fault that comes back). A resumed attempt starts from the newest
verified checkpoint, as `--resume latest` does.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from trainer import checkpoint as ckpt


def emit(run: Path, rank: int, kind: str, **fields) -> None:
    (run / "events").mkdir(parents=True, exist_ok=True)
    line = json.dumps({"v": 1, "time": time.time(), "rank": rank, "kind": kind, **fields})
    with open(run / "events" / f"rank-{rank}.jsonl", "a") as f:
        f.write(line + "\n")


def _archive(path: Path) -> None:
    """Bytes shaped like torch.save's (a zip with data.pkl), which is what verification reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", b"stand-in")


def save_checkpoint(run: Path, rank: int, world: int, step: int, wait_s: float = 15.0) -> bool:
    """This rank's part of a ZeRO-2 checkpoint; rank 0 waits for the others' (the trainer's barrier)
    and publishes it with the trainer's finalize. False when a rank's files never came."""
    tmp = run / "checkpoints" / f"step-{step}.tmp"
    _archive(tmp / ckpt.rank_state_name(rank))
    _archive(tmp / ckpt.DS_TAG / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    if rank != 0:
        return True
    if os.environ.get("FAKE_SAVE_FAIL") == "1":
        return False
    _archive(tmp / ckpt.DS_TAG / "mp_rank_00_model_states.pt")
    (tmp / ckpt.WEIGHTS).write_bytes(b"stand-in weights")
    (tmp / "trainer" / "state.json").write_text(json.dumps({"step": step}))
    deadline = time.time() + wait_s
    while ckpt.check_files(tmp, world, 2) and time.time() < deadline:
        time.sleep(0.05)
    try:
        ckpt.finalize(tmp, step, world, 2)
    except ckpt.CheckpointError:
        return False
    return True


def rank_main(run: Path, rank: int, world: int, max_steps: int, step_s: float, start_step: int) -> int:
    stop = {"asked": False}
    if os.environ.get("FAKE_IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: stop.update(asked=True))
    fail_rank, _, fail_step = os.environ.get("FAKE_FAIL_AT", "-1:-1").partition(":")
    stop_file = Path(os.environ["FAKE_STOP_FILE"]) if os.environ.get("FAKE_STOP_FILE") else None
    slow_rank, _, slow_s = os.environ.get("FAKE_SLOW_STOP", "-1:0").partition(":")
    die_rank, _, die_step = os.environ.get("FAKE_DIE_AT", "-1:-1").partition(":")
    every = int(os.environ.get("FAKE_CKPT_EVERY", "0"))
    agreed = run / f"fake-stop-step-{start_step}"
    (run / "heartbeat").mkdir(parents=True, exist_ok=True)
    emit(run, rank, "start", world_size=world, step=start_step, max_steps=max_steps)
    step, started = start_step, time.time()
    while step < max_steps:
        if step >= _peers_step(run, rank, world, started) - 1:
            time.sleep(step_s)
        step += 1
        if rank == int(die_rank) and step == int(die_step):
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == int(fail_rank) and step == int(fail_step):
            emit(run, rank, "error", message="ValueError: injected failure", traceback="Traceback ...")
            emit(run, rank, "stop", step=step, reason="error", exit_status=1)
            return 1
        emit(
            run,
            rank,
            "step",
            step=step,
            loss=1.0 / step,
            psnr=10.0 + step,
            samples_per_s=4.0,
            step_time_s=step_s,
            lr=1e-3,
        )
        beat = run / "heartbeat" / f"rank-{rank}.json"
        tmp = beat.with_name(f".{beat.name}.tmp")  # replaced whole, as the trainer does: never read half
        # the trainer's heartbeat fields: the step time is what the console's stall threshold scales with
        tmp.write_text(
            json.dumps(
                {
                    "step": step,
                    "time": time.time(),
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "step_time_s": step_s,
                    "wait_s": 0.0,
                    "data_wait_s": 0.0,
                }
            )
        )
        os.replace(tmp, beat)
        if every and step % every == 0 and step < max_steps:
            saved = save_checkpoint(run, rank, world, step)
            if rank == 0:
                emit(run, rank, "checkpoint", step=step, status="complete" if saved else "failed")
        if stop["asked"] and not agreed.exists():
            # the trainer's all-reduce of the stop flag, in files: the first rank to be asked
            # names a step a little ahead, which every rank reaches (they drift by under a step)
            try:
                fd = os.open(agreed, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                os.write(fd, str(step + 2).encode())
                os.close(fd)
            except FileExistsError:
                pass
        at = _agreed_step(agreed)
        if (at is not None and step >= at) or (stop_file is not None and stop_file.exists()):
            if rank == int(slow_rank):
                time.sleep(float(slow_s))
            saved = save_checkpoint(run, rank, world, step)
            if rank == 0:
                emit(
                    run,
                    rank,
                    "checkpoint",
                    step=step,
                    status="complete" if saved else "failed",
                    path=str(run / f"checkpoints/step-{step}"),
                )
            emit(run, rank, "stop", step=step, reason="signal", exit_status=0, signal="SIGTERM")
            return 0
    emit(run, rank, "stop", step=step, reason="done", exit_status=0)
    return 0


def _peers_step(run: Path, rank: int, world: int, since: float) -> int:
    """The furthest step in the other ranks' heartbeats written since `since` (-1 before any; an
    earlier attempt's beats do not count)."""
    furthest = -1
    for other in range(world):
        if other != rank:
            try:
                beat = json.loads((run / "heartbeat" / f"rank-{other}.json").read_text())
                if float(beat["time"]) >= since:
                    furthest = max(furthest, int(beat["step"]))
            except (OSError, ValueError, KeyError, TypeError):
                pass
    return furthest


def _agreed_step(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None  # absent, or being written this instant: read again next step


def launcher_main(args: argparse.Namespace) -> int:
    ranks = []
    for local in range(args.ranks):
        rank = args.node * args.ranks + local
        cmd = [
            sys.executable,
            __file__,
            "rank",
            "--run",
            str(args.run),
            "--rank",
            str(rank),
            "--world",
            str(args.world),
            "--max-steps",
            str(args.max_steps),
            "--step-s",
            str(args.step_s),
            "--start-step",
            str(args.start_step),
        ]
        ranks.append((rank, local, subprocess.Popen(cmd, start_new_session=True)))
    signalled = {"sig": None}

    def forward(signum, _frame):
        signalled["sig"] = signum
        for _r, _l, p in ranks:
            try:
                os.killpg(p.pid, signum)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    while True:
        codes = [(r, lr, p.poll(), p.pid) for r, lr, p in ranks]
        bad = [c for c in codes if c[2] not in (None, 0)]
        if bad:
            r, lr, code, pid = bad[0]
            for _r, _l, p in ranks:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
            print("=" * 60)
            print("fake.trainer FAILED")
            print("-" * 60)
            print("Root Cause (first observed failure):")
            print("[0]:")
            print(f"  host      : {socket.gethostname()}")
            print(f"  rank      : {r} (local_rank: {lr})")
            print(f"  exitcode  : {code} (pid: {pid})")
            print("=" * 60, flush=True)
            return 1
        if all(c[2] == 0 for c in codes):
            linger_node, _, linger_s = os.environ.get("FAKE_LINGER", "-1:0").partition(":")
            if args.node == int(linger_node):
                time.sleep(float(linger_s))  # torchrun's exit barrier, waiting for the other agents
            return 1 if signalled["sig"] else 0
        time.sleep(0.05)


def fake_commands(ctrl, ranks_per_node: int, max_steps: int, step_s: float, start_step: int = 0):
    """Make a RunController start this file's launcher instead of `accelerate launch`."""
    from taehv_console.core.run.backends import NodeCommand

    def commands(attempt: int, resume, weights_only):
        world = ctrl.cfg.topology.world_size
        newest = ckpt.scan(ctrl.run.checkpoints).newest if resume == "latest" else None
        first = newest.step if newest is not None else start_step
        return [
            NodeCommand(
                index=i,
                host="localhost",
                argv=(
                    sys.executable,
                    __file__,
                    "launcher",
                    "--run",
                    str(ctrl.run.path),
                    "--node",
                    str(i),
                    "--ranks",
                    str(ranks_per_node),
                    "--world",
                    str(world),
                    "--max-steps",
                    str(max_steps),
                    "--step-s",
                    str(step_s),
                    "--start-step",
                    str(first),
                ),
                env=dict(ctrl.state.env),
                log=str(ctrl.run.node_log(i)),
                status=str(ctrl.run.node_status_path(i)),
                cwd=str(ctrl.run.path),
            )
            for i in ctrl.state.controlled
        ]

    ctrl.commands = commands


def console_main(args: argparse.Namespace) -> int:
    """A console that launches the run in args.run and follows it (tests kill it mid-run)."""
    from taehv_console.core.cluster.ssh import SshPool, SshSettings
    from taehv_console.core.run.control import RunController
    from taehv_console.core.run.rundir import RunDir

    with SshPool(SshSettings.from_env()) as pool:
        ctrl = RunController.open(RunDir(args.run), pool, purpose="test console")
        fake_commands(ctrl, args.ranks, args.max_steps, args.step_s)
        ctrl.launch()
        print("launched", flush=True)
        ctrl.follow()
    return 0


def supervisor_main(args: argparse.Namespace) -> int:
    """The real supervisor loop (core/flow/supervisor.py), its relaunches made with this file's
    launcher, as `taehv-console supervise` runs it; prints its lines and exits with the run's code."""
    import time as _time

    from taehv_console.core.cluster.ssh import SshPool, SshSettings
    from taehv_console.core.flow.supervisor import Supervisor
    from taehv_console.core.run.rundir import RunDir
    from taehv_console.exit_codes import exit_code_for

    def say(text: str) -> None:
        print(f"{_time.strftime('%H:%M:%S')} {text}", flush=True)

    with SshPool(SshSettings.from_env()) as pool:
        outcome = Supervisor(
            RunDir(args.run),
            pool,
            say,
            prepare=lambda ctrl: fake_commands(ctrl, args.ranks, args.max_steps, args.step_s),
        ).serve()
    return 2 if outcome is None else int(exit_code_for(outcome.phase, final=outcome.final))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("launcher", "rank", "console", "supervise"))
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--node", type=int, default=0)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--step-s", type=float, default=0.2)
    parser.add_argument("--start-step", type=int, default=0)
    args = parser.parse_args()
    if args.role == "rank":
        return rank_main(args.run, args.rank, args.world, args.max_steps, args.step_s, args.start_step)
    if args.role == "console":
        return console_main(args)
    if args.role == "supervise":
        return supervisor_main(args)
    return launcher_main(args)


if __name__ == "__main__":
    sys.exit(main())
