"""Flight Recorder's launch environment for NCCL ranks: which variables, pointing where. Kept in
plan (with the other launch files) so that launching needs nothing from forensics; core/forensics
reads the same paths back to trigger and collect dumps.

What the installed torch says (2.13, headers shipped in torch/include/torch/csrc/distributed/c10d):
- ProcessGroupNCCL.hpp: the trace buffer size it uses is TORCH_NCCL_TRACE_BUFFER_SIZE only, and
  `DumpPipe` creates `<TORCH_NCCL_DEBUG_INFO_PIPE_FILE><rank>.pipe` only when that size is > 0
  (TORCH_FR_BUFFER_SIZE, read by FlightRecorder.hpp, does not create the pipe). The pipe is opened
  O_RDONLY|O_NONBLOCK and any byte written to it asks for a dump. TORCH_NCCL_DUMP_ON_TIMEOUT is
  declared there ("must be set together with TORCH_NCCL_ENABLE_MONITORING=1 and
  TORCH_NCCL_TRACE_BUFFER_SIZE > 0"); that the pipe is polled every second only with it (else
  every 480 s) is in ProcessGroupNCCL.cpp, which the wheel does not ship (FACTS, read in source).
- FlightRecorder.hpp: DebugInfoWriter writes `<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>`; each dump
  replaces the last, so every dump is copied away at once.

The pipe lives in the node's /tmp, not in the run directory: a missing directory or a shared file
system that cannot hold a FIFO would make ProcessGroupNCCL fail at start (its mkfifo is a
TORCH_CHECK), and /tmp always exists. The dumps go to the run directory, visible from the console.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TRACE_BUFFER_SIZE = 2000  # entries in each rank's ring buffer (torch's own default for TORCH_FR_BUFFER_SIZE)
FR_DIR = "forensics/fr"
TRACE_PREFIX = "trace_rank_"

ENV_BUFFER = "TORCH_NCCL_TRACE_BUFFER_SIZE"
ENV_DUMP_ON_TIMEOUT = "TORCH_NCCL_DUMP_ON_TIMEOUT"
ENV_TEMP_FILE = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
ENV_PIPE_FILE = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class FlightRecorderPaths:
    trace_stem: str  # TORCH_NCCL_DEBUG_INFO_TEMP_FILE: rank r writes <stem><r>
    pipe_stem: str  # TORCH_NCCL_DEBUG_INFO_PIPE_FILE: rank r reads <stem><r>.pipe on its node
    copies: str  # where dumps are copied after each trigger, one folder per stall


def paths_for(run_dir: str | Path) -> FlightRecorderPaths:
    run = Path(run_dir)
    # the run id keeps two runs on one node apart in the shared /tmp
    run_id = _SAFE.sub("-", run.name) or "run"
    return FlightRecorderPaths(
        trace_stem=str(run / FR_DIR / "live" / TRACE_PREFIX),
        pipe_stem=f"/tmp/taehv-fr-{run_id}-rank_",
        copies=str(run / FR_DIR),
    )


def flight_recorder_env(run_dir: str | Path) -> dict[str, str]:
    """What every NCCL rank is launched with so a stall can be dumped on demand and on timeout."""
    p = paths_for(run_dir)
    return {
        # the legacy name: only it makes ProcessGroupNCCL create the pipe
        ENV_BUFFER: str(TRACE_BUFFER_SIZE),
        # without it the pipe is looked at every 480 s, not every second
        ENV_DUMP_ON_TIMEOUT: "1",
        ENV_TEMP_FILE: p.trace_stem,
        ENV_PIPE_FILE: p.pipe_stem,
    }


def prepare_dirs(run_dir: str | Path) -> None:
    """Create the folder the ranks dump into (DebugInfoWriter does not create it)."""
    Path(paths_for(run_dir).trace_stem).parent.mkdir(parents=True, exist_ok=True)
