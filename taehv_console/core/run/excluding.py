"""The run controller's node exclusion: carry out the recovery policy's decision to leave a node out
(core/run/recovery.py's Action.EXCLUDE) before the relaunch.

- With a spare host left (--spares), the spare takes the node's machine rank once preflight passes
  on the run's new set of hosts; the world size, and so the checkpoint, stay as they are.
- Without one, the run goes on with one node fewer: the config is derived again for that topology
  (core/plan/reshape.py, the effective batch kept through accumulation where it divides), the newest
  checkpoint is converted to DeepSpeed's universal checkpoint, which the trainer loads at the new
  world size with its optimizer state, step, LR and data position.

Either way run.toml and the launch files are written again for the new hosts (node 0's address is
the rendezvous), and state.json records the exclusion with its evidence. Only the backends that
start every node themselves do this: ssh, and slurm inside an allocation, whose next srun step runs
on the remaining nodes alone (core/run/backends.py: SrunBackend). An allocation's nodes are all
there is: spares are for ssh.

A run resumed inside another SLURM allocation (a new `salloc`) finds its hosts gone: they were
the old allocation's. The launch takes the first nodes of the allocation it is in, in SLURM's
order, and writes run.toml and the launch files again for them (`_fit_allocation`).

A part of RunController (core/run/control.py); it uses the controller's state and primitives,
declared in parts.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import replace

from taehv_console.core.cluster.hosts import InvalidHostError, expand_slurm_hostlist
from taehv_console.core.cluster.preflight.orchestrate import PreflightOptions, run_preflight
from taehv_console.core.cluster.ssh import SshError, master_address
from taehv_console.core.models import BackendKind, NodeSpec, Topology, TopologySource
from taehv_console.core.plan.render import RenderOptions, accelerate_config_name, write_launch_files
from taehv_console.core.plan.reshape import for_nodes
from taehv_console.core.run.outcome import AllocationTooSmallError, LaunchError
from taehv_console.core.run.parts import ControllerParts
from taehv_console.core.run.state import Exclusion
from trainer import checkpoint as ckpt
from trainer.config import TrainConfig

# DeepSpeed's converter on an 11M-parameter model takes seconds; a shared filesystem under load
# may make it minutes, never this long
CONVERT_TIMEOUT_S = 900.0


class ExcludeError(RuntimeError):
    """A node could not be left out (no spare passed preflight and the checkpoint could not be
    converted, say); the message says why, and the run ends FAILED with it."""


class ExcludeMixin(ControllerParts):
    def can_exclude(self) -> bool:
        """Whether this run can be relaunched without one of its nodes: the console starts every
        node itself (over ssh, or as srun steps inside a SLURM allocation), on more than one node."""
        return self.kind in (BackendKind.SSH, BackendKind.SLURM) and self.cfg.topology.nodes > 1

    def free_spares(self) -> tuple[str, ...]:
        """The spare hosts not in the run and never left out of it (ssh only: inside a SLURM
        allocation the allocation's nodes are what there is)."""
        if self.kind is not BackendKind.SSH:
            return ()
        used = set(self.state.hosts) | {e.host for e in self.state.exclusions}
        return tuple(h for h in self.state.spares if h not in used)

    def _fit_allocation(self, env: Mapping[str, str] | None = None) -> None:
        """Before a launch inside a SLURM allocation: when the run's hosts are not all in this one
        (the run was started in another), this allocation's first nodes take their machine ranks
        and the launch files are written again for them. AllocationTooSmallError when it has too few
        nodes (LaunchError when its node list cannot be read)."""
        env = os.environ if env is None else env
        var = "SLURM_JOB_NODELIST" if "SLURM_JOB_NODELIST" in env else "SLURM_NODELIST"
        if self.kind is not BackendKind.SLURM or var not in env:
            return
        try:
            allocated = expand_slurm_hostlist(env[var])
        except (ValueError, InvalidHostError) as err:
            raise LaunchError(f"{var}: {err}") from None
        nodes = self.cfg.topology.nodes
        hosts = tuple(self.state.hosts[:nodes])
        if set(hosts) <= set(allocated):
            return
        job = env.get("SLURM_JOB_ID", "?")
        if len(allocated) < nodes:
            raise AllocationTooSmallError(
                f"this allocation (SLURM job {job}: {', '.join(allocated)}) has {len(allocated)} node(s); "
                f"the run needs {nodes} (it ran on {', '.join(hosts)}): allocate {nodes} node(s) and "
                "resume there"
            )
        new = tuple(allocated[:nodes])
        self._rewrite(self.cfg, new, self._master(new[0]))
        self._save(replace(self.state, hosts=new, master_addr=self._master(new[0])))
        self._note(
            f"the run's nodes ({', '.join(hosts)}) are not in this allocation (SLURM job {job}): "
            f"it runs on {', '.join(new)}, its launch files written again for them"
        )

    def _leave_out(self, node: int, why: str) -> Exclusion:
        """Leave `node` out: a spare in its place, else one node fewer. Raises ExcludeError."""
        a = self._launched()
        host = self._host(node) or "?"
        hosts = list(self.state.hosts)
        nodes = self.cfg.topology.nodes
        spare, tried = self._passing_spare(node)
        converted = None
        changes: tuple[str, ...]
        if spare is not None:
            hosts[node] = spare
            cfg = self.cfg
            changes = (f"node {node}: {host} -> spare {spare}; the world size stays {self.world_size}",)
        else:
            if nodes - 1 < self.cfg.recovery.min_nodes:
                raise ExcludeError(
                    f"node {node} ({host}) cannot be left out: "
                    + (f"{'; '.join(tried)}, and " if tried else "no spare host, and ")
                    + f"recovery.min_nodes = {self.cfg.recovery.min_nodes} keeps all {nodes} node(s)"
                )
            reshaped = for_nodes(self.cfg, nodes - 1)
            cfg, changes = reshaped.config, reshaped.changes + tuple(tried)
            del hosts[node]
            converted = self._convert_newest()
        master = self._master(hosts[0])
        self._rewrite(cfg, tuple(hosts), master)
        record = Exclusion(
            node=node,
            host=host,
            why=why,
            time=time.time(),
            attempt=a.number,
            replaced_by=spare,
            nodes_before=nodes,
            nodes_after=cfg.topology.nodes,
            changes=changes,
            checkpoint=converted,
        )
        if cfg.topology.nodes < nodes:
            self._forget_ranks(cfg, nodes)
        self.cfg = cfg
        self._save(
            replace(
                self.state,
                hosts=tuple(hosts),
                master_addr=master,
                controlled=tuple(range(cfg.topology.nodes)),
                exclusions=(*self.state.exclusions, record),
            )
        )
        return record

    def _passing_spare(self, node: int) -> tuple[str | None, list[str]]:
        """The first free spare that passes preflight in `node`'s place, and what the others found."""
        tried: list[str] = []
        for spare in self.free_spares():
            hosts = list(self.state.hosts)
            hosts[node] = spare
            problem = self._preflight(tuple(hosts), spare)
            if problem is None:
                self._note(f"spare {spare} passed preflight in node {node}'s place")
                return spare, tried
            tried.append(f"spare {spare} failed preflight: {problem}")
            self._note(tried[-1])
        return None, tried

    def _preflight(self, hosts: tuple[str, ...], spare: str) -> str | None:
        """Preflight on the run's hosts with `spare` among them: None when it passes, else the
        errors (those of other hosts too: the relaunch needs every one)."""
        per = self.cfg.topology.gpus_per_node
        topology = Topology(
            source=TopologySource.HOSTFILE,
            node_count=len(hosts),
            nodes=tuple(NodeSpec(host=h, machine_rank=i, slots=per) for i, h in enumerate(hosts)),
            master_addr=self._master(hosts[0]),
            master_port=self.state.master_port,
        )
        options = PreflightOptions(
            runs_dir=str(self.run.path.parent),
            master_port=self.state.master_port,
            loader_clips=0,  # the loader's cost is not what decides whether a spare can train
        )
        try:
            report = run_preflight(topology, self.cfg, self.pool, options, progress=self._note)
        except (SshError, OSError) as err:
            return f"{spare}: {err}"
        if report.ok:
            return None
        return "; ".join(f"{f.node or 'all'}: {f.message}" for f in report.errors)

    def _master(self, node0: str) -> str:
        """The rendezvous address for a run whose node 0 is `node0`, as the run's launch files were
        first rendered: under SLURM the node's name as the allocation lists it (the cluster resolves
        it; an ssh config on this machine says nothing about the nodes srun starts), over ssh its
        HostName from the ssh config."""
        if self.kind is BackendKind.SLURM:
            return node0
        return master_address(node0, self.pool.settings)

    def _convert_newest(self) -> str | None:
        """Convert the newest verified checkpoint to a universal one (once; kept beside it), so the
        run resumes at the new world size with its optimizer state. None when there is none yet
        (the run starts afresh)."""
        newest = ckpt.scan(self.run.checkpoints).newest
        if newest is None:
            return None
        if ckpt.universal_problem(newest.path) is None:
            return str(newest.path)
        argv = [sys.executable, *ckpt.universal_command(newest.path)[1:]]
        self._note(f"converting {newest.path.name} to a universal checkpoint for the new world size")
        t0 = time.monotonic()
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=CONVERT_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise ExcludeError(f"converting {newest.path} to a universal checkpoint failed: {err}") from None
        problem = ckpt.universal_problem(newest.path)
        if done.returncode or problem:
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise ExcludeError(
                f"converting {newest.path} to a universal checkpoint failed (exit {done.returncode}): "
                f"{problem or tail}"
            )
        self._note(f"converted in {time.monotonic() - t0:.0f} s: {newest.path / ckpt.UNIVERSAL}")
        return str(newest.path)

    def _rewrite(self, cfg: TrainConfig, hosts: tuple[str, ...], master: str) -> None:
        """run.toml and every launch file again, for these hosts and this master."""
        write_launch_files(
            cfg,
            self.run.path,
            RenderOptions(
                run_dir=str(self.run.path),
                hosts=hosts,
                main_process_ip=master,
                main_process_port=self.state.master_port,
            ),
        )

    def _forget_ranks(self, cfg: TrainConfig, nodes_before: int) -> None:
        """Files of the machine ranks and ranks the run no longer has: their accelerate configs,
        status files and heartbeats would otherwise read as parts of the smaller run."""
        per = cfg.topology.gpus_per_node
        for i in range(cfg.topology.nodes, nodes_before):
            (self.run.path / accelerate_config_name(i)).unlink(missing_ok=True)
            self.run.node_status_path(i).unlink(missing_ok=True)
            for r in range(i * per, (i + 1) * per):
                (self.run.heartbeats / f"rank-{r}.json").unlink(missing_ok=True)
