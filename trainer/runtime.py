"""A rank's process setup: environment, the process group with the configured timeout, accelerate's
DeepSpeed plugin, and what follows from them (rank, world, device, precision), plus the stop flag
and the collectives every shared decision goes through."""

from __future__ import annotations

import functools
import importlib
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from accelerate import Accelerator, PartialState
from accelerate.utils import DeepSpeedPlugin
from deepspeed import DeepSpeedEngine
from deepspeed.comm import comm as ds_comm
from deepspeed.runtime import compiler as ds_compiler

from trainer.config import TrainConfig
from trainer.ds_config import build_deepspeed_config, resolve_precision
from trainer.events import CollectiveWatch, EventWriter, install_stack_dump
from trainer.faults import FaultPlan
from trainer.log import RankLogger


class SetupError(RuntimeError):
    """The run cannot start as configured (device, teacher, world size); the message says why."""


# torch's JIT extension builds (DeepSpeed's CPU shm_comm op among them) take a `lock` file in the
# extension's build folder; a build that was killed leaves it behind, and every later build, on
# every later launch, waits for it forever. A build takes a minute or two: a lock this old is
# nobody's.
STALE_BUILD_LOCK_S = 900.0


def clear_stale_build_locks(
    root: Path | None = None, older_than_s: float = STALE_BUILD_LOCK_S, now: float | None = None
) -> list[Path]:
    """Remove extension build locks older than `older_than_s` under torch's build root
    ($TORCH_EXTENSIONS_DIR, else ~/.cache/torch_extensions with its per-Python folders); returns
    what it removed. One process per node calls it, before anything builds."""
    if root is None:
        env = os.environ.get("TORCH_EXTENSIONS_DIR")
        root = Path(env) if env else Path.home() / ".cache" / "torch_extensions"
    now = time.time() if now is None else now
    removed = []
    for lock in [*root.glob("*/lock"), *root.glob("*/*/lock")]:
        try:
            if now - lock.stat().st_mtime > older_than_s:
                lock.unlink()
                removed.append(lock)
        except OSError:
            continue  # gone meanwhile, or not ours to remove: the build says so itself
    return removed


def prefer_this_environments_ninja(
    executable: str = sys.executable, environ: MutableMapping[str, str] = os.environ
) -> bool:
    """Put the `ninja` installed beside this interpreter first on PATH; returns whether PATH changed.

    torch builds JIT extensions (DeepSpeed's CPU shm_comm op) with whichever `ninja` PATH finds
    first, and ninja's build log keeps a hash of each command that other ninja versions compute
    differently. With pip's ninja (1.13) in the environment and Debian's (1.11) in /usr/bin, every
    launch whose PATH differed from the last one's took the op's unchanged build for a changed one
    and rebuilt it: a minute of every core before the first step (a launcher started by the node
    wrapper, whose PATH starts with the environment's bin, after one started from a shell whose
    PATH does not). Every rank calls this: whichever rank holds torch's build lock runs ninja."""
    bindir = os.path.dirname(executable)
    own = os.path.join(bindir, "ninja")
    if not (os.path.isfile(own) and os.access(own, os.X_OK)):
        return False
    path = environ.get("PATH", "")
    if shutil.which("ninja", path=path) == own:
        return False
    environ["PATH"] = bindir + os.pathsep + path if path else bindir
    return True


class StopRequest:
    """SIGTERM/SIGINT only set a flag; the loop finishes the step and all ranks agree to stop."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handler)

    def _handler(self, signum: int, _frame: object) -> None:
        self.requested = True
        self.signal_name = signal.Signals(signum).name


# DeepSpeed's torch backend builds its CPU shared-memory all-reduce op (deepspeed_shm_comm) when it
# starts, as a JIT C++ extension: ~50 CPU-s of g++ on a machine's first CPU run (the first cpu-smoke
# waits ~30 s for it), again whenever another environment or ninja last built it, and a C++ compiler
# is needed at all. Only DeepSpeed's inference_all_reduce (AutoTP inference) uses it; training
# reduces through torch.distributed (gloo), which is what DeepSpeed falls back to without the op.
DEEPSPEED_SHM_BUILD = "build_shm_op"


def skip_deepspeed_shm_op() -> bool:
    """Keep DeepSpeed from building its shm_comm op (trainer training never calls it); False where
    this DeepSpeed has no such step (another version): then nothing is changed."""
    # the module by its name: `deepspeed.comm.torch` as an attribute is the torch package itself
    backend = importlib.import_module("deepspeed.comm.torch")
    if not callable(getattr(backend, DEEPSPEED_SHM_BUILD, None)):
        return False
    setattr(backend, DEEPSPEED_SHM_BUILD, lambda: None)
    return True


# DeepSpeed imports its Muon optimizer on every engine's creation (its ZeRO optimizer check) and in
# ZeRO-1/2's gradient reduction, and that module decorates three functions with DeepSpeed's
# `compiler.compile()`, i.e. torch.compile, whose decoration alone loads all of Inductor: 1-2.5 s
# of every eager rank's start, for an optimizer this trainer never builds (it builds AdamW). So the
# runtime imports it first with that decorator made lazy: torch.compile is applied at the first call
# (which never comes here), as torch.compile itself compiles only then. A compiled run loads
# Inductor for its own graphs anyway.
DEEPSPEED_MUON = "deepspeed.runtime.zero.muon.muon_optimizer"


def import_deepspeed_muon_lazily() -> bool:
    """Import DeepSpeed's Muon module without loading Inductor; False where it was already imported
    or DeepSpeed has no such module or decorator (another version): then nothing is changed."""
    if DEEPSPEED_MUON in sys.modules:
        return False
    eager_compile = getattr(ds_compiler, "compile", None)
    if eager_compile is None:
        return False

    def lazy_compile() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            compiled: list[Callable[..., Any]] = []

            @functools.wraps(fn)
            def call(*args: Any, **kwargs: Any) -> Any:
                if not compiled:
                    compiled.append(eager_compile()(fn))
                return compiled[0](*args, **kwargs)

            return call

        return decorate

    ds_compiler.compile = lazy_compile
    try:
        importlib.import_module(DEEPSPEED_MUON)
    except ImportError:
        return False
    finally:
        ds_compiler.compile = eager_compile
    return True


class DeepSpeedSettings(DeepSpeedPlugin):
    """accelerate's DeepSpeed plugin, less the hook it registers for transformers: on every
    rank's start it imports `transformers.integrations` (~0.9 s on a CPU core, each launch and
    each relaunch) to hand the config to transformers' from_pretrained, which reads it to build
    models under ZeRO-3's partitioned init. Nothing in this trainer calls from_pretrained: the
    student is built here, and the teacher is diffusers', loaded whole on every rank."""

    def set_deepspeed_weakref(self) -> None:
        self.dschf = None


def set_single_process_env() -> None:
    """A run started without a launcher still gets a (1-process) process group, so one code path
    serves 1 and N processes."""
    if "WORLD_SIZE" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="1",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


class Collectives:
    """The small all-reduces and barriers the trainer's shared decisions ride on. Each is marked in
    the collective watch (a rank blocked in one says so in its heartbeat), and the time blocked is
    summed into `wait_s`: every rank's step time is the same (collectives line them up), so step time
    minus this wait is what tells a straggler from the ranks waiting for it."""

    def __init__(self, device: torch.device, on_cuda: bool, watch: CollectiveWatch):
        self.device = device if on_cuda else torch.device("cpu")
        self.watch = watch
        self.wait_s = 0.0
        self._flag = torch.zeros(1, device=self.device)  # the stop flag's buffer, reused every step
        self._in_flight: dist.Work | None = None  # its reduction, launched at the last call

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        t0 = time.time()
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        with self.watch.waiting("all_reduce"):
            dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
            out = t.tolist()  # on CUDA the wait for the other ranks lands here, so it is inside the timing
        self.wait_s += time.time() - t0
        return out

    def stop_agreed(self, requested: bool) -> bool:
        """Whether any rank had asked to stop at the previous call. This call's flag is reduced in
        the background and read at the next call, when its reduction is long done: one host read
        of a device value per optimizer step, which never waits for this step's work. Every rank
        calls it at the same steps, so all of them stop at the same step, one step after the ask."""
        agreed = self._finish_stop_flag()
        self._flag.fill_(1.0 if requested else 0.0)  # the last reduction is done: the buffer is free
        self._in_flight = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX, async_op=True)
        return agreed

    def _finish_stop_flag(self) -> bool:
        if self._in_flight is None:
            return False
        work, self._in_flight = self._in_flight, None
        t0 = time.time()
        with self.watch.waiting("all_reduce"):
            work.wait()
            agreed = self._flag.item() > 0
        self.wait_s += time.time() - t0
        return agreed

    def settle(self) -> None:
        """Wait for the stop flag's reduction in flight (before the process group goes down)."""
        self._finish_stop_flag()

    def barrier(self) -> None:
        with self.watch.waiting("barrier"):
            dist.barrier()


# deepspeed.comm's backend methods that make every rank meet: ZeRO's gradient reduction and
# parameter gathers, its overflow and norm checks, and checkpoint barriers go through them.
DEEPSPEED_COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "inference_all_reduce",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_base",
    "all_gather_coalesced",
    "all_to_all_single",
    "all_to_all",
    "gather",
    "scatter",
    "barrier",
    "monitored_barrier",
)


class _WatchedWork:
    """An async collective's handle whose wait is marked in the collective watch; everything else
    is the handle's own."""

    def __init__(self, work: Any, op: str, watch: CollectiveWatch):
        self._work, self._op, self._watch = work, op, watch

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        with self._watch.waiting(self._op):
            out = self._work.wait(*args, **kwargs)
        self._watch.issued(self._op)  # on NCCL the stream now waits for it: the host may not yet
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _watched(method: Any, op: str, watch: CollectiveWatch) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        with watch.waiting(op):
            out = method(*args, **kwargs)
        if out is not None and not isinstance(out, torch.Tensor) and callable(getattr(out, "wait", None)):
            return _WatchedWork(out, op, watch)
        watch.issued(op)
        return out

    call.taehv_unwatched = method  # type: ignore[attr-defined]
    return call


class CudaMark:
    """The device's progress past the newest collective, for the collective watch: one CUDA event,
    re-recorded on the current stream after each of DeepSpeed's calls (microseconds), and queried,
    never waited on, by the watch thread while the host may be blocked in a read."""

    def __init__(self) -> None:
        self._event = torch.cuda.Event()

    def record(self) -> None:
        self._event.record()

    def done(self) -> bool:
        return bool(self._event.query())


def watch_deepspeed_collectives(watch: CollectiveWatch) -> list[str]:
    """Mark DeepSpeed's own collectives in the collective watch, as the trainer's are. Without this
    a rank whose peer stopped inside forward or backward blocks in ZeRO's gradient reduction and
    never says it waits, so the console cannot tell it from the stopped rank. On gloo the call (or
    its handle's wait) is where the rank blocks. On NCCL it only enqueues and the host blocks at a
    later read; each call marks the stream (`CollectiveWatch.issued`), and a collective the device
    does not get past is told as the wait. The heartbeat names them `deepspeed.<method>`. A later
    runtime in the same process (tests build several) takes the marks over. Returns the methods it
    wrapped."""
    backend = ds_comm.cdb
    if backend is None:
        raise SetupError("DeepSpeed's communication backend is not initialised after the process group")
    wrapped = []
    for name in DEEPSPEED_COLLECTIVES:
        method = getattr(backend, name, None)
        if method is None:
            continue
        method = getattr(method, "taehv_unwatched", method)
        setattr(backend, name, _watched(method, f"deepspeed.{name}", watch))
        wrapped.append(name)
    return wrapped


@dataclass
class Runtime:
    """What one rank runs on. `start` builds it; a SetupError from it means no event was written."""

    run_dir: Path
    accelerator: Accelerator
    ds_config: dict[str, Any]
    precision: str
    device_kind: str
    rank: int
    world: int
    local_rank: int
    device: torch.device
    events: EventWriter
    collectives: Collectives
    faults: FaultPlan
    log: RankLogger
    stop: StopRequest
    # where this rank's start went: its process's creation (`created_at`, epoch seconds) and the
    # seconds from it to each stage's end, told in the start event (benchmarks/smoke_start.py)
    startup: dict[str, float] = field(default_factory=dict)

    def mark(self, stage: str) -> None:
        self.startup[stage] = round(time.time() - psutil.Process().create_time(), 3)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def model_dtype(self) -> torch.dtype:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision, torch.float32)

    @classmethod
    def start(cls, run_dir: Path, cfg: TrainConfig, imported_at: float | None = None) -> Runtime:
        """`imported_at`: when the rank's imports were done (its start event says how long they took)."""
        created = psutil.Process().create_time()
        startup = {"created_at": round(created, 3)}
        if imported_at:
            startup["imports"] = round(imported_at - created, 3)
        device_kind = cfg.topology.device
        if device_kind == "cuda" and not torch.cuda.is_available():
            raise SetupError(f"{run_dir}/run.toml: topology.device is cuda but no CUDA device is visible")
        # first: a rank that hangs in the rendezvous or the process group's creation has a stack too
        install_stack_dump(run_dir, int(os.environ.get("RANK", "0")))
        prefer_this_environments_ninja()
        if os.environ.get("LOCAL_RANK", "0") == "0":
            for lock in clear_stale_build_locks():
                RankLogger(int(os.environ.get("RANK", "0"))).warning(
                    f"removed {lock}: a killed extension build left it, and every build would wait on it",
                    every_rank=True,
                )
        os.environ.setdefault("DS_ACCELERATOR", "cpu" if device_kind == "cpu" else "cuda")
        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        import_deepspeed_muon_lazily()
        skip_deepspeed_shm_op()
        set_single_process_env()
        if device_kind == "cuda":
            # clip shapes are fixed for a run, so cuDNN's per-shape algorithm search pays off
            torch.backends.cudnn.benchmark = True
        if device_kind == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
        for k, v in cfg.distributed.nccl_env.items():
            os.environ.setdefault(k, v)
        # The process group is created here, with the configured timeout: DeepSpeed and accelerate
        # reuse it, so collective_timeout_s really is what a hung collective waits for.
        PartialState(
            backend="gloo" if device_kind == "cpu" else "nccl",
            timeout=timedelta(seconds=cfg.distributed.collective_timeout_s),
        )
        startup["process_group"] = round(time.time() - created, 3)
        ds_config = build_deepspeed_config(cfg, device_kind)
        accelerator = Accelerator(deepspeed_plugin=DeepSpeedSettings(hf_ds_config=ds_config))
        rank, world = accelerator.process_index, accelerator.num_processes
        if world != cfg.topology.world_size:
            raise SetupError(
                f"run.toml says {cfg.topology.nodes} node(s) × {cfg.topology.gpus_per_node} = "
                f"{cfg.topology.world_size} processes, but the launcher started {world}"
            )
        events = EventWriter(run_dir, rank)
        watch = CollectiveWatch(events, device=CudaMark() if device_kind == "cuda" else None)
        watch_deepspeed_collectives(watch)
        rt = cls(
            run_dir=run_dir,
            accelerator=accelerator,
            ds_config=ds_config,
            precision=resolve_precision(cfg, device_kind),
            device_kind=device_kind,
            rank=rank,
            world=world,
            local_rank=accelerator.local_process_index,
            device=accelerator.device,
            events=events,
            collectives=Collectives(accelerator.device, device_kind == "cuda", watch),
            faults=FaultPlan(rank),
            log=RankLogger(rank),
            stop=StopRequest(),
            startup=startup,
        )
        rt.stop.install()
        return rt

    def leave(self, engine: DeepSpeedEngine) -> None:
        """Leave together and take the process group down: rank 0 still writes the exported weights
        after the last collective, and NCCL wants its communicators destroyed. On gloo this alone
        does not stop the SIGABRT a finalising interpreter now and then met ("terminate called
        without an active exception", so torchrun called a finished run failed): the process then
        leaves without finalising (trainer.cli.entry, trainer.hard_exit)."""
        self.collectives.settle()
        self.collectives.barrier()
        engine.destroy()
        self.accelerator.end_training()
