"""LocalRunner.open streams lines as they come, including lines that arrive in one write."""

import sys

from taehv_console.core.cluster.ssh import LocalRunner


def test_lines_written_together_are_all_read_without_waiting_for_more_output():
    code = "import sys, time; sys.stdout.write('a\\nb\\nc\\n'); sys.stdout.flush(); time.sleep(30)"
    stream = LocalRunner().open([sys.executable, "-c", code])
    try:
        # the second and third lines are already here: they must not wait for the 30 s sleep
        assert [stream.readline(10), stream.readline(1), stream.readline(1)] == ["a", "b", "c"]
        assert stream.readline(0.2) is None
    finally:
        stream._proc.kill()
        stream.close()
