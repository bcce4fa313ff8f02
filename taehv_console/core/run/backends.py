"""Launch backends behind one interface: start every controlled node's launcher, list what of it is
still alive, send the stop signal, SIGKILL what is left.

- local:    this machine alone (LocalRunner);
- ssh:      every node of a hostfile over SSH (localhost entries run directly);
- platform: a pod/container of PAI-DLC, Kubeflow or a Kubernetes Indexed Job: this node only,
            machine rank = the platform's node index; the platform starts the others;
- slurm:    inside an allocation: one detached `srun` starts the wrapper on every node;
- sbatch:   from a login node: submit the rendered sbatch script; the job is the launcher (it runs
            preflight on its nodes first, then the node wrapper on each under srun).

Each node's launcher runs under the node wrapper (core/run/node.py) in its own session; the
backend records host, pid and pgid, and every later action names that group (and the tree below
it), never a process name.
"""

from __future__ import annotations

import re
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from taehv_console.core.cluster.hosts import is_local_host
from taehv_console.core.cluster.ssh import LocalRunner, NodeRunner, SshError, SshPool, fan_out, is_unreachable
from taehv_console.core.models import BackendKind
from taehv_console.core.plan.flight_recorder import prepare_dirs
from taehv_console.core.plan.render import (
    NODE_MODULE,
    SBATCH,
    UNSUBMITTABLE,
    flight_recorder_launch_env,
    slurm_filename,
)
from taehv_console.core.run import node
from taehv_console.core.run.rundir import RunDir
from taehv_console.core.run.state import Attempt, NodeLauncher, NodeStatus, read_node_status

BACKENDS = tuple(k.value for k in BackendKind)


class BackendError(RuntimeError):
    """A node could not be reached or a command failed; says which node and what to do."""


@dataclass(frozen=True)
class NodeCommand:
    """What one node runs: the launcher argv (accelerate launch ...), its environment, and where
    its output and status go. `index` is the machine rank."""

    index: int
    host: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    log: str = ""
    status: str = ""
    cwd: str = ""


def wrapper_argv(python: str, command: NodeCommand, attempt: int) -> list[str]:
    return [
        python,
        "-m",
        NODE_MODULE,
        "launch",
        "--status",
        command.status,
        "--node",
        str(command.index),
        "--attempt",
        str(attempt),
        "--",
        *command.argv,
    ]


@dataclass(frozen=True)
class Started:
    launchers: tuple[NodeLauncher, ...]
    errors: Mapping[int, str]  # node -> why it could not be started
    slurm_job: str | None = None
    unreachable: frozenset[int] = frozenset()  # of `errors`, the nodes that could not be reached


class LaunchBackend(ABC):
    """The one interface the controller uses; node keys are machine ranks (-1: a driver process
    such as srun that stands for every node).

    Every pid a backend signals is checked on its node first (node.identify): a recorded group
    that is not proven the run's gets no signal. Those refusals are kept for the controller, which
    records them (`take_refusals`): FOREIGN ones count as gone (the launcher is dead, its pid
    taken by another process), UNPROVEN ones as unknown (NotTheRunsError)."""

    kind: str = ""

    def __init__(self) -> None:
        self._refusals: dict[int, str] = {}
        self._refusals_lock = threading.Lock()

    def take_refusals(self) -> dict[int, str]:
        """node -> why its recorded group was not signalled (nor listed), since the last call."""
        with self._refusals_lock:
            out, self._refusals = self._refusals, {}
        return out

    def _refuse(self, index: int, why: str) -> None:
        with self._refusals_lock:
            self._refusals[index] = why

    def _checked(self, launcher: NodeLauncher, reply: Mapping[str, Any], value: Any) -> Any:
        """`value` when the node tool found the group the run's (or nothing left); a FOREIGN group
        is kept as a refusal and counts as nothing left; an UNPROVEN one raises NotTheRunsError."""
        why = launcher_identity(launcher, reply)
        if why is None:
            return value
        self._refuse(launcher.index, why)
        if reply.get("identity") == node.UNPROVEN:
            raise NotTheRunsError(f"{why}; no signal sent")
        return type(value)()

    @abstractmethod
    def start(self, run: RunDir, commands: Sequence[NodeCommand], attempt: int) -> Started: ...

    @abstractmethod
    def processes(self, run: RunDir, attempt: Attempt) -> dict[int, tuple[int, ...] | Exception]:
        """node -> live pids of its launcher's tree (empty: nothing left), or why it is unknown."""

    @abstractmethod
    def terminate(self, run: RunDir, attempt: Attempt, nodes: Sequence[int] | None = None) -> dict[int, str]:
        """SIGTERM each launcher's process group; node -> error text for the ones that failed."""

    @abstractmethod
    def kill(
        self, run: RunDir, attempt: Attempt, nodes: Sequence[int] | None = None
    ) -> dict[int, tuple[int, ...] | Exception]:
        """SIGKILL each launcher's whole tree; node -> pids still there afterwards."""

    def job_exit_code(self, attempt: Attempt) -> int | None:
        """Only for backends without node wrappers (sbatch): the job's exit code once it ended."""
        return None

    def describe(self, attempt: Attempt) -> list[str]:
        return [f"node {n.index} on {n.host}: pid {n.pid}, pgid {n.pgid}" for n in attempt.nodes]

    def close(self) -> None:
        return None


def flight_recorder_env_for(run: RunDir) -> dict[str, str]:
    """Flight Recorder's variables for an NCCL run, pointing into this run directory (the
    controller builds its env without one), with the dump folder made (torch does not make it).
    Empty for gloo, or when run.toml cannot be read (the launch reports that itself)."""
    try:
        cfg = run.load_config()
        env = flight_recorder_launch_env(cfg, run.path)
        if env:
            prepare_dirs(run.path)
    except (OSError, ValueError):
        return {}
    return env


def identity_args(run: RunDir, launcher: NodeLauncher, attempt: int) -> list[str]:
    """The node tool's options that say whose group this is (node.identify checks them where the
    group lives): pgid, the run id, machine rank and attempt, and the leader's start time and boot
    id as read at spawn. A launch recorded before those were kept takes them from its wrapper's
    status file, when that file names the same pid for the same attempt."""
    start, boot = launcher.start_ticks, launcher.boot_id
    if start is None and launcher.index >= 0:
        st: NodeStatus | None = run.node_status(launcher.index)
        if st is not None and st.attempt == attempt and st.pid == launcher.pid:
            start, boot = st.start_ticks, boot or st.boot_id
    args = ["--pgid", str(launcher.pgid), "--run-id", run.run_id]
    args += ["--node", str(launcher.index), "--attempt", str(attempt)]
    if start is not None:
        args += ["--start-ticks", str(start)]
    if boot:
        args += ["--boot-id", boot]
    return args


class NotTheRunsError(BackendError):
    """Something lives at a recorded pid or group, but nothing proves it is the run's: no signal
    was sent, and whether the run's launcher still lives there is unknown."""


def launcher_identity(launcher: NodeLauncher, reply: Mapping[str, Any]) -> str | None:
    """Why the node tool refused a recorded group (its `identity` was FOREIGN or UNPROVEN), as one
    line naming node, host and pid; None when it was the run's, or nothing was left."""
    verdict = reply.get("identity")
    if verdict not in (node.FOREIGN, node.UNPROVEN):
        return None
    where = f"node {launcher.index}" if launcher.index >= 0 else "srun"
    return f"{where} ({launcher.host}): {reply.get('why') or verdict}"


class RunnerBackend(LaunchBackend):
    """local, ssh and platform: node launchers started through NodeRunners (SSH or this machine)."""

    def __init__(self, kind: str, pool: SshPool, command_timeout_s: float = 30.0):
        super().__init__()
        self.kind = kind
        self.pool = pool
        self.timeout = command_timeout_s

    def _runner(self, host: str) -> NodeRunner:
        return self.pool.runner(host)

    def start(self, run: RunDir, commands: Sequence[NodeCommand], attempt: int) -> Started:
        def one(key: str) -> NodeLauncher:
            c = by_index[int(key)]
            r = self._runner(c.host)
            p = r.start_detached(
                wrapper_argv(r.python, c, attempt),
                log_path=c.log,
                cwd=c.cwd or None,
                env={**fr_env, **c.env, node.RUN_ID_ENV: run.run_id},
                timeout=self.timeout + 30,
            )
            return NodeLauncher.from_spawn(c.index, c.host, p)

        by_index = {c.index: c for c in commands}
        fr_env = flight_recorder_env_for(run)  # the command's own env wins
        results = fan_out([str(c.index) for c in commands], one, self.pool.settings.max_parallel)
        launchers, errors, unreachable = [], {}, set()
        for key, res in results.items():
            if isinstance(res, Exception):
                errors[int(key)] = _why(res)
                if is_unreachable(res):
                    unreachable.add(int(key))
            else:
                launchers.append(res)
        return Started(
            tuple(sorted(launchers, key=lambda n: n.index)), errors, unreachable=frozenset(unreachable)
        )

    def _each(
        self,
        run: RunDir,
        attempt: Attempt,
        nodes: Sequence[int] | None,
        fn: Callable[[NodeLauncher, list[str]], Any],
    ) -> dict[int, Any]:
        chosen = [n for n in attempt.nodes if nodes is None or n.index in nodes]
        by_key = {str(n.index): n for n in chosen}
        out = fan_out(
            list(by_key),
            lambda k: fn(by_key[k], identity_args(run, by_key[k], attempt.number)),
            self.pool.settings.max_parallel,
        )
        return {int(k): v for k, v in out.items()}

    def _node_call(
        self, launcher: NodeLauncher, args: list[str], require: tuple[str, ...]
    ) -> Mapping[str, Any]:
        # this machine: the same functions in-process, without a Python start per poll
        return (
            self._runner(launcher.host)
            .call(NODE_MODULE, args, timeout=self.timeout, require=require, in_process=_local_node_call)
            .value()
        )

    def processes(self, run: RunDir, attempt: Attempt) -> dict[int, tuple[int, ...] | Exception]:
        def one(n: NodeLauncher, ident: list[str]) -> tuple[int, ...]:
            reply = self._node_call(n, ["pids", *ident], ("pids",))
            return self._checked(n, reply, tuple(reply["pids"]))

        return self._each(run, attempt, None, one)

    def terminate(self, run: RunDir, attempt: Attempt, nodes: Sequence[int] | None = None) -> dict[int, str]:
        def one(n: NodeLauncher, ident: list[str]) -> Mapping[str, Any]:
            reply = self._node_call(n, ["kill", *ident, "--signal", "TERM"], ("signalled",))
            self._checked(n, reply, reply)
            if reply.get("identity") == node.FOREIGN:  # the stop must say it sent nothing there
                raise NotTheRunsError(f"{launcher_identity(n, reply)}; no signal sent")
            return reply

        return {
            k: _why(v) for k, v in self._each(run, attempt, nodes, one).items() if isinstance(v, Exception)
        }

    def kill(
        self, run: RunDir, attempt: Attempt, nodes: Sequence[int] | None = None
    ) -> dict[int, tuple[int, ...] | Exception]:
        def one(n: NodeLauncher, ident: list[str]) -> tuple[int, ...]:
            reply = self._node_call(n, ["kill", *ident, "--signal", "KILL"], ("left",))
            return self._checked(n, reply, tuple(reply["left"]))

        return self._each(run, attempt, nodes, one)


def _local_node_call(args: list[str]) -> dict:
    return node.tree_command(node.build_parser().parse_args(args))


def _why(err: Exception) -> str:
    if isinstance(err, SshError) and err.fix:
        return f"{err} ({err.fix})"
    return str(err) or type(err).__name__


# ----------------------------------------------------------------------------------------- slurm


class SrunBackend(LaunchBackend):
    """Inside a SLURM allocation: one `srun` (detached, on this machine) starts the node wrapper on
    the run's nodes with machine rank = SLURM_NODEID. A stop signals the step's processes through
    `scancel --signal=TERM JOB.STEP` (srun itself would SIGKILL them), and SLURM removes a step's
    processes when the step ends.

    Each step runs on the nodes its commands name, and on no others: `--nodes` is their count and
    `--nodelist` their hosts. After the console left a node out (core/run/excluding.py), the commands
    name the remaining hosts, and the next step starts on those alone, numbered 0..k-1 as the launch
    files rendered for them expect."""

    kind = "slurm"
    # flags of a node's State in `scontrol show node` that say SLURM cannot reach or use it
    _DOWN = frozenset({"DOWN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWER_DOWN", "POWERING_DOWN"})

    def __init__(
        self,
        pool: SshPool,
        nodes: int = 0,
        srun: str = "srun",
        scontrol: str = "scontrol",
        scancel: str = "scancel",
    ):
        # `nodes` (the run's node count when the backend was made) is not used: an exclusion changes
        # the count under a controller that keeps this backend, and each start's commands say it
        del nodes
        super().__init__()
        self.local = LocalRunner("localhost", pool.settings.python)
        self.pool = pool
        self.srun = srun
        self.scontrol = scontrol
        self.scancel = scancel

    def node_down(self, host: str) -> str:
        """The node's SLURM state when it says SLURM cannot reach or use the node (DOWN, FAIL,
        NOT_RESPONDING, powered down), else "". Inside an allocation the console reaches its nodes
        through SLURM alone: whether ssh answers there says nothing (many clusters let no one ssh to
        a compute node). "" too when scontrol cannot tell: not knowing is no evidence."""
        try:
            res = self.local.run([self.scontrol, "show", "node", "-o", host], timeout=30)
        except (SshError, OSError):
            return ""
        state = next((t.partition("=")[2] for t in res.stdout.split() if t.startswith("State=")), "")
        return state if res.exit_status == 0 and self._DOWN & set(state.split("+")) else ""

    @staticmethod
    def _where(commands: Sequence[NodeCommand]) -> list[str]:
        """srun's node options for these commands: their count, and their hosts where the commands
        name them. --nodelist and not --exclude: it names exactly the hosts the launch files were
        rendered for, from the commands alone, also when the allocation holds more nodes than the
        run (with --exclude, SLURM would pick which of the rest)."""
        hosts = [c.host for c in commands]
        where = [f"--nodes={len(commands)}"]
        if len(set(hosts)) == len(hosts) and not any(is_local_host(h) for h in hosts):
            where.append(f"--nodelist={','.join(hosts)}")
        return where

    def srun_argv(self, run: RunDir, commands: Sequence[NodeCommand], attempt: int) -> list[str]:
        # every node's command differs only in its machine rank: written once with {node}, which
        # the wrapper fills from SLURM_NODEID
        ordered = sorted(commands, key=lambda c: c.index)
        c0 = ordered[0]
        template = [
            a.replace(f"accelerate-node-{c0.index}.yaml", "accelerate-node-{node}.yaml") for a in c0.argv
        ]
        status = str(run.logs / "node-{node}.status.json")
        return [
            self.srun,
            "--kill-on-bad-exit=1",
            *self._where(ordered),
            "--ntasks-per-node=1",
            f"--output={slurm_filename(str(run.logs))}/node-%n.log",  # argv: no shell, but % is a pattern
            "--open-mode=append",
            self.pool.settings.python,
            "-m",
            NODE_MODULE,
            "launch",
            "--status",
            status,
            "--node-env",
            "SLURM_NODEID",
            "--attempt",
            str(attempt),
            "--",
            *template,
        ]

    def start(self, run: RunDir, commands: Sequence[NodeCommand], attempt: int) -> Started:
        indices = sorted(c.index for c in commands)
        if not commands:
            return Started((), {-1: "srun was given no node to start"})
        if indices != list(range(len(commands))):
            # SLURM numbers a step's nodes 0..k-1 in the allocation's order: other machine ranks
            # would start with configs that are not theirs
            return Started(
                (), {-1: f"srun starts machine ranks 0..{len(commands) - 1}, not {indices}: the run's nodes"}
            )
        argv = self.srun_argv(run, commands, attempt)
        try:
            p = self.local.start_detached(
                argv,
                log_path=str(run.logs / "srun.log"),
                cwd=str(run.path),
                env={**flight_recorder_env_for(run), **commands[0].env, node.RUN_ID_ENV: run.run_id},
            )
        except (SshError, OSError) as err:
            return Started((), {-1: _why(err)})
        return Started((NodeLauncher.from_spawn(-1, "localhost", p),), {})

    def _driver(self, attempt: Attempt) -> NodeLauncher | None:
        return next((n for n in attempt.nodes if n.index == -1), None)

    def _driver_call(self, run: RunDir, attempt: Attempt, d: NodeLauncher, *args: str) -> Mapping[str, Any]:
        """The node tool on srun's group on this machine, its identity checked first."""
        return _local_node_call([args[0], *identity_args(run, d, attempt.number), *args[1:]])

    def processes(self, run: RunDir, attempt: Attempt) -> dict[int, tuple[int, ...] | Exception]:
        d = self._driver(attempt)
        if d is None:
            return {}
        reply = self._driver_call(run, attempt, d, "pids")
        try:
            return {-1: self._checked(d, reply, tuple(reply["pids"]))}
        except NotTheRunsError as err:
            return {-1: err}

    def _scancel_steps(self, run: RunDir, attempt: Attempt, *options: str) -> str | None:
        """`scancel OPTIONS JOB.STEP` for the attempt's step(s), as its node wrappers recorded them:
        None when no wrapper has said its step yet, "" when scancel did it, else why it did not."""
        found = (read_node_status(p) for p in sorted(run.logs.glob("node-*.status.json")))
        steps = sorted(
            {st.slurm_step for st in found if st and st.attempt == attempt.number and st.slurm_step}
        )
        if not steps:
            return None
        argv = [self.scancel, *options, *steps]
        try:
            res = self.local.run(argv, timeout=30)
        except (SshError, OSError) as err:
            return f"{' '.join(argv)}: {_why(err)}"
        return (
            "" if res.exit_status == 0 else f"{' '.join(argv)}: {(res.stderr or res.stdout).strip()[-200:]}"
        )

    def terminate(self, run: RunDir, attempt: Attempt, nodes: Sequence[int] | None = None) -> dict[int, str]:
        """SIGTERM to every process of the attempt's step (`scancel --signal=TERM JOB.STEP`), as the
        ranks need for their checkpoint. Not to srun: srun answers SIGTERM by SIGKILLing the
        step's tasks ("forcing job termination"), which ends the ranks with no checkpoint. Only a
        step whose wrappers have not yet said which step they are (or a failed scancel) gets srun's
        SIGTERM."""
        why = self._scancel_steps(run, attempt, "--signal=TERM")
        if why == "":
            return {}
        d = self._driver(attempt)
        if d:
            reply = self._driver_call(run, attempt, d, "kill", "--signal", "TERM")
            refused = launcher_identity(d, reply)
            if refused:
                self._refuse(d.index, refused)
                return {-1: f"{refused}; no signal sent"}
        return {-1: why} if why else {}

    def kill(
        self, run: RunDir, attempt: Attempt, nodes: Sequence[int] | None = None
    ) -> dict[int, tuple[int, ...] | Exception]:
        """`scancel JOB.STEP` ends the step's processes on every node; srun's group gets SIGKILL
        (which ends the step's launch on this machine also when scancel could not)."""
        self._scancel_steps(run, attempt)
        d = self._driver(attempt)
        if d is None:
            return {}
        reply = self._driver_call(run, attempt, d, "kill", "--signal", "KILL")
        try:
            return {-1: self._checked(d, reply, tuple(reply["left"]))}
        except NotTheRunsError as err:
            return {-1: err}

    def describe(self, attempt: Attempt) -> list[str]:
        d = self._driver(attempt)
        return [f"srun on this machine: pid {d.pid}, pgid {d.pgid}"] if d else []


class SbatchBackend(LaunchBackend):
    """From a login node: submit the rendered sbatch script. The job is the launcher: its state
    comes from squeue/sacct, the stop is `scancel --signal=TERM` (every step's tasks get it), then
    `scancel` after the grace period."""

    kind = "sbatch"
    _ALIVE = frozenset(
        {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STOPPED"}
    )

    def __init__(
        self,
        runner: NodeRunner | None = None,
        sbatch: str = "sbatch",
        squeue: str = "squeue",
        scancel: str = "scancel",
        sacct: str = "sacct",
        scontrol: str = "scontrol",
    ):
        super().__init__()
        self.runner = runner or LocalRunner("localhost", sys.executable)
        self.cmd = {
            "sbatch": sbatch,
            "squeue": squeue,
            "scancel": scancel,
            "sacct": sacct,
            "scontrol": scontrol,
        }

    def start(self, run: RunDir, commands: Sequence[NodeCommand], attempt: int) -> Started:
        script = run.path / SBATCH
        if not script.is_file():
            return Started((), {-1: f"{script} is missing: render the run's files first"})
        first = script.read_text(errors="replace").splitlines()[1:2]
        if first and first[0].startswith(UNSUBMITTABLE):  # render_sbatch_or_refusal's stand-in
            return Started((), {-1: first[0].removeprefix("# taehv-console: ")})
        c0 = commands[0]
        resume = {"TAEHV_RESUME": "", "TAEHV_WEIGHTS_ONLY": ""}  # never inherited from this console's env
        if "--resume" in c0.argv:  # the script passes these on to taehv-train
            resume["TAEHV_RESUME"] = c0.argv[c0.argv.index("--resume") + 1]
            if "--weights-only" in c0.argv:
                resume["TAEHV_WEIGHTS_ONLY"] = "1"
        argv = [self.cmd["sbatch"], "--parsable", f"--chdir={run.path}"]
        # the script's node wrapper and preflight run with this console's interpreter, and record
        # this attempt's number in the status files the console reads
        env = {**c0.env, "TAEHV_PYTHON": self.runner.python, "TAEHV_ATTEMPT": str(attempt), **resume}
        try:
            res = self.runner.run(argv + [str(script)], env=env, timeout=60)
        except (SshError, OSError) as err:
            return Started((), {-1: _why(err)})
        m = re.match(r"\s*(\d+)", res.stdout or "")
        if res.exit_status != 0 or not m:
            return Started(
                (),
                {-1: f"sbatch failed (exit {res.exit_status}): {(res.stderr or res.stdout).strip()[-300:]}"},
            )
        return Started((), {}, slurm_job=m.group(1))

    def _state(self, job: str) -> str:
        res = self.runner.run([self.cmd["squeue"], "-h", "-j", job, "-o", "%T"], timeout=30)
        return (
            (res.stdout or "").strip().splitlines()[0].strip()
            if res.exit_status == 0 and res.stdout.strip()
            else ""
        )

    def processes(self, run: RunDir, attempt: Attempt) -> dict[int, tuple[int, ...] | Exception]:
        if not attempt.slurm_job:
            return {}
        try:
            state = self._state(attempt.slurm_job)
        except (SshError, OSError) as err:
            return {-1: BackendError(_why(err))}
        # no pids to show for a job on other machines: its id stands for them while it lives
        return {-1: (int(attempt.slurm_job),) if state in self._ALIVE else ()}

    def terminate(self, run: RunDir, attempt: Attempt, nodes: Sequence[int] | None = None) -> dict[int, str]:
        if attempt.slurm_job:
            res = self.runner.run([self.cmd["scancel"], "--signal=TERM", attempt.slurm_job], timeout=30)
            if res.exit_status != 0:
                return {-1: f"scancel failed: {(res.stderr or res.stdout).strip()[-200:]}"}
        return {}

    def kill(
        self, run: RunDir, attempt: Attempt, nodes: Sequence[int] | None = None
    ) -> dict[int, tuple[int, ...] | Exception]:
        if not attempt.slurm_job:
            return {}
        self.runner.run([self.cmd["scancel"], attempt.slurm_job], timeout=30)
        return self.processes(run, attempt)

    def job_exit_code(self, attempt: Attempt) -> int | None:
        """From the controller while it still holds the job (MinJobAge, 300 s by default), else
        from accounting: a cluster without slurmdbd has no sacct, and its jobs still end."""
        if not attempt.slurm_job:
            return None
        res = self.runner.run([self.cmd["scontrol"], "show", "job", "-o", attempt.slurm_job], timeout=30)
        fields = (
            dict(tok.partition("=")[::2] for tok in (res.stdout or "").split())
            if res.exit_status == 0
            else {}
        )
        if "JobState" in fields and "ExitCode" in fields:
            return self._exit_code(fields["JobState"], fields["ExitCode"])
        res = self.runner.run(
            [self.cmd["sacct"], "-j", attempt.slurm_job, "-X", "-n", "-P", "-o", "State,ExitCode"], timeout=30
        )
        line = (res.stdout or "").strip().splitlines()[:1]
        if res.exit_status != 0 or not line:
            return None
        state, _, code = line[0].partition("|")
        return self._exit_code(state, code)

    def _exit_code(self, state: str, code: str) -> int | None:
        """`EXIT:SIGNAL` of a job that has ended; None while it lives."""
        if not state.split() or state.split()[0] in self._ALIVE:
            return None
        exit_code, _, sig = code.partition(":")
        try:
            return -int(sig) if sig and int(sig) else int(exit_code)
        except ValueError:
            return None

    def describe(self, attempt: Attempt) -> list[str]:
        return [f"SLURM job {attempt.slurm_job}"] if attempt.slurm_job else []


def make_backend(kind: str | BackendKind, pool: SshPool, nodes: int = 1) -> LaunchBackend:
    try:
        k = BackendKind(kind)
    except ValueError:
        raise ValueError(f"unknown backend {kind!r} (one of {', '.join(BACKENDS)})") from None
    if k is BackendKind.SLURM:
        return SrunBackend(pool, nodes)
    if k is BackendKind.SBATCH:
        return SbatchBackend()
    return RunnerBackend(k.value, pool)


def hosts_are_local(hosts: Sequence[str]) -> bool:
    return all(is_local_host(h) for h in hosts)


def node_paths(run: RunDir, index: int) -> tuple[str, str]:
    """(log, status) paths of node `index` as every node sees them (the run dir is shared)."""
    return str(run.node_log(index)), str(run.node_status_path(index))
