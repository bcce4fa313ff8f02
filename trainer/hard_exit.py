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

multiprocessing's own atexit handler SIGTERMs its daemonic children and then joins every child
without a timeout. The data loader's workers ignore SIGTERM (a stop sent to the rank's process
group must not take them down mid-step: trainer.data), so a rank whose loader iterator was still
alive at the end (held by a reference cycle, which no collection frees before exit) waited for them
forever. They are daemonic, which means they end with their parent: they are killed first.

Imports nothing heavy: `taehv-train --help` stays torch-free.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import traceback
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Kill multiprocessing's daemonic children, run the atexit handlers, flush stdout/stderr, and
    end the process with `code` at once."""
    try:
        try:
            _kill_daemonic_children()
        except Exception:  # noqa: BLE001 - said, and the atexit handlers still run
            traceback.print_exc()
        atexit._run_exitfuncs()  # prints a failing handler's traceback and goes on, as at exit
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (AttributeError, OSError, ValueError):
                pass
        os._exit(code)


def _kill_daemonic_children() -> None:
    """SIGKILL and reap this process's daemonic multiprocessing children (the loader's workers).
    torch's loader watches its workers from a SIGCHLD handler that raises when one was killed; left
    in place, that error cut this function (and the atexit handlers after it) short, leaving the
    worker a zombie. Leaving, nobody needs that report: SIGCHLD goes back to its default first."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:  # never imported: no children of its own
        return
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    except ValueError:  # called from another thread, where it cannot be set: the handler stays
        pass
    for child in mp.active_children():
        if child.daemon:
            child.kill()
            child.join(timeout=5)
