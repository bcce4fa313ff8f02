"""Leave a process that ran gloo collectives without letting the interpreter finalise.

A gloo process group's worker threads drop their reference to a finished collective a moment after
the caller's `wait()` returns. When that is the last reference to a tensor Python also saw, dropping
it takes the GIL. If the main thread has meanwhile begun finalising (the script returned), the
worker thread exits inside a noexcept destructor and the process aborts: SIGABRT, "terminate called
without an active exception", so torchrun reports a finished rank as failed. A core dump from this
machine shows it: `~AsyncBarrierWork` -> `~AsyncAllgatherWork` -> `decref_pyobject` ->
`take_gil` -> `pthread_exit` on `ProcessGroupGloo::runLoop`'s thread, while the main thread is in
`Py_FinalizeEx`'s collection.

`destroy_process_group()` does not help: it only drops torch's own references (DeepSpeed keeps
others, so `~ProcessGroupGloo` never joins its threads) and gloo's `shutdown()` is a no-op
(pytorch/pytorch#190489; the fix upstream, #179291, was abandoned). So a rank finishes the way a
finalising interpreter would, minus the part that races those threads: atexit handlers (logging,
multiprocessing's children) and the standard streams, then `os._exit`.

Imports nothing heavy: `taehv-train --help` stays torch-free.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Run the atexit handlers, flush stdout/stderr, and end the process with `code` at once."""
    try:
        atexit._run_exitfuncs()  # prints a failing handler's traceback and goes on, as at exit
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(code)
