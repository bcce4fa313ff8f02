"""The run controller's launch: every controlled node's launcher command, starting them as a new
attempt (a resume when asked), and the checkpoint a resume starts from, checked against the run's
world size before anything starts.

A part of RunController (core/run/control.py); it uses the controller's state and primitives,
declared in parts.py.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import replace
from pathlib import Path

from taehv_console.core.plan.render import RenderOptions, launch_command, launch_env
from taehv_console.core.run.backends import NodeCommand
from taehv_console.core.run.outcome import (
    LaunchError,
    NothingToResumeError,
    ResumePoint,
    RunLiveError,
    WorldSizeChangedError,
)
from taehv_console.core.run.parts import ControllerParts
from taehv_console.core.run.progress import file_sizes
from taehv_console.core.run.state import Attempt, Failure, Phase, RunState
from trainer import checkpoint as ckpt


class LaunchMixin(ControllerParts):
    def commands(self, attempt: int, resume: str | None, weights_only: bool) -> list[NodeCommand]:
        cfg = self.cfg
        env = {
            **launch_env(cfg),
            # torchrun gives its ranks this long after forwarding SIGTERM before it SIGKILLs them;
            # its default of 30 s would cut a checkpoint short of our own grace period
            "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(int(self.grace_s)),
            **dict(self.state.env),
        }
        hosts = self.state.hosts or ("localhost",) * cfg.topology.nodes
        out = []
        for i in self.state.controlled:
            argv = launch_command(cfg, i, RenderOptions(run_dir=str(self.run.path)))
            if resume:
                argv += ["--resume", resume] + (["--weights-only"] if weights_only else [])
            out.append(
                NodeCommand(
                    index=i,
                    host=hosts[i] if i < len(hosts) else "localhost",
                    argv=tuple(argv),
                    env=env,
                    log=str(self.run.node_log(i)),
                    status=str(self.run.node_status_path(i)),
                    cwd=str(self.run.path),
                )
            )
        return out

    def launch(
        self, resume: str | None = None, weights_only: bool = False, restarted: int | None = None
    ) -> RunState:
        """Start every controlled node's launcher (a resume when `resume` is given). Refuses a run
        whose processes are alive. On a node that cannot be started, the others are killed."""
        a = self.attempt
        if a is not None and a.ended is None:
            live = self.live_nodes()
            if live:
                raise RunLiveError(
                    f"{self.run.run_id} is running (node(s) {', '.join(map(str, sorted(live)))} "
                    "alive): a second launch would start it twice; attach to it instead "
                    f"(taehv-console attach {self.run.run_id})"
                )
            self.reconcile()  # the last attempt ended without a console: record how, before the next
            a = self.attempt
        self._fit_allocation()  # a SLURM run resumed in another allocation: this one's nodes
        number = (a.number if a else 0) + 1
        for i in self.state.controlled:
            self.run.node_status_path(i).unlink(
                missing_ok=True
            )  # a stale status is never read as this attempt's
        self.run.stop_request_path.unlink(missing_ok=True)
        attempt = Attempt(
            number=number,
            started=time.time(),
            resume=resume,
            weights_only=weights_only,
            event_offsets=tuple(sorted(file_sizes(self.run.events).items())),
            from_step=restarted if restarted is not None else self._resume_step(resume),
            restarted_by="recovery" if restarted is not None else "",
            restart_budget=self.cfg.recovery.max_restarts,
        )
        self._save(replace(self.state.with_attempt(attempt), phase=Phase.LAUNCHING, failure=None, stop=None))
        self._reset_follow()
        started = self.backend.start(self.run, self.commands(number, resume, weights_only), number)
        attempt = replace(attempt, nodes=started.launchers, slurm_job=started.slurm_job)
        self._save(self.state.with_attempt(attempt))
        if started.errors:
            # a node that cannot be reached is blamed first: the recovery policy leaves it out
            node, why = min(started.errors.items(), key=lambda kv: (kv[0] not in started.unreachable, kv[0]))
            failure = Failure(
                reason=f"could not start the launcher: {why}",
                node=node if node >= 0 else None,
                host=self._host(node),
                detected=time.time(),
                kind="node-lost" if node in started.unreachable else "launch",
            )
            if started.launchers:
                self.backend.kill(self.run, attempt)
            self._save(
                replace(
                    self.state.with_attempt(replace(attempt, ended=time.time(), outcome="failed")),
                    phase=Phase.FAILED,
                    failure=failure,
                )
            )
            raise LaunchError(failure.summary())
        if restarted is None:
            self.notifier.send("launched", self._event_text(f"attempt {number} launched"), attempt=number)
        return self._save(replace(self.state, phase=Phase.RUNNING))

    def _resume_step(self, resume: str | None) -> int:
        """The step a launch starts from: 0 fresh, else its checkpoint's."""
        if not resume:
            return 0
        st = ckpt.scan(self.run.checkpoints).newest if resume == "latest" else ckpt.verify(Path(resume))
        return st.step if st is not None and st.ok else 0

    def resume_point(self, weights_only: bool = False, from_path: str | None = None) -> ResumePoint:
        """The checkpoint a resume starts from (newest complete one, or `from_path`), checked against
        this run's world size before anything starts."""
        if from_path:
            st = ckpt.verify(Path(from_path))
            if not st.ok:
                raise NothingToResumeError(
                    f"{from_path}: not a complete checkpoint ({st.state}: {'; '.join(st.problems)})"
                )
            skipped: tuple[str, ...] = ()
            spec = str(Path(from_path).absolute())
        else:
            scan = ckpt.scan(self.run.checkpoints)
            skipped = tuple(f"{s.path.name}: {'; '.join(s.problems)}" for s in scan.skipped)
            if scan.newest is None:
                extra = f" (skipped: {'; '.join(skipped)})" if skipped else ""
                raise NothingToResumeError(
                    f"{self.run.run_id}: no complete checkpoint in {self.run.checkpoints}"
                    f"{extra}; start a new run instead"
                )
            st = scan.newest
            spec = "latest"
        if st.step >= self.cfg.optim.max_steps and self.run.final_weights.is_file():
            raise NothingToResumeError(
                f"{self.run.run_id} finished at step {st.step} of {self.cfg.optim.max_steps}; "
                f"its weights are in {self.run.final_weights.parent}"
            )
        world = self.world_size
        if (
            st.world_size is not None
            and st.world_size != world
            and not weights_only
            and ckpt.universal_problem(st.path) is not None
        ):  # a converted one loads at any world size
            t = self.cfg.topology
            raise WorldSizeChangedError(
                f"{self.run.run_id}: {st.path.name} was written by {st.world_size} processes, but run.toml now has "
                f"{t.nodes} node(s) x {t.gpus_per_node} = {world}. ZeRO optimizer shards cannot be loaded at another "
                "world size, so the console will not try. Two supported paths:\n"
                f"  1. weights only, with a fresh optimizer:  taehv-console resume {self.run.run_id} --weights-only\n"
                "  2. DeepSpeed's universal checkpoint (keeps the optimizer state): convert once, then resume:\n"
                f"     {shlex.join(ckpt.universal_command(st.path))}\n"
                f"     taehv-console resume {self.run.run_id}"
            )
        return ResumePoint(
            spec=spec, step=st.step, path=str(st.path), world_size=st.world_size, skipped=skipped
        )
