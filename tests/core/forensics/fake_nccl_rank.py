"""Stands in for one NCCL rank's Flight Recorder side (no NCCL here): does what ProcessGroupNCCL's
DumpPipe does (torch 2.13 ProcessGroupNCCL.hpp): unlink and mkfifo `<PIPE_FILE><rank>.pipe`, open it
O_RDONLY|O_NONBLOCK, poll it; on any byte read, write the dump to `<TEMP_FILE><rank>` in place (as
DebugInfoWriter's ofstream does, not atomically). The dump written is a recorded real one.

    python fake_nccl_rank.py RANK DUMP_FILE   (env: TORCH_NCCL_DEBUG_INFO_PIPE_FILE, _TEMP_FILE)
"""

import os
import sys
import time


def wait_for_dump_request(fd: int) -> None:
    while True:
        try:
            if os.read(fd, 128):
                return
        except BlockingIOError:
            pass
        time.sleep(0.2)


def main() -> None:
    rank, dump = int(sys.argv[1]), sys.argv[2]
    pipe = f"{os.environ['TORCH_NCCL_DEBUG_INFO_PIPE_FILE']}{rank}.pipe"
    target = f"{os.environ['TORCH_NCCL_DEBUG_INFO_TEMP_FILE']}{rank}"
    try:
        os.unlink(pipe)
    except FileNotFoundError:
        pass
    os.mkfifo(pipe, 0o666)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    print("ready", flush=True)
    data = open(dump, "rb").read()
    while True:
        wait_for_dump_request(fd)
        with open(target, "wb") as out:  # in two halves, so a reader can catch it half written
            out.write(data[: len(data) // 2])
            out.flush()
            time.sleep(0.05)
            out.write(data[len(data) // 2 :])


if __name__ == "__main__":
    main()
