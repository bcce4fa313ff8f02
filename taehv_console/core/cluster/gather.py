"""Facts of many nodes in one round: the probe module run on every node at once, each answer
turned into a ProbeResult (facts, or what went wrong and the fix), with the node's clock offset.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping

from taehv_console.core.cluster.hosts import InvalidHostError, validate_host
from taehv_console.core.cluster.ssh import CommandError, NodeRunner, SshError, SshPool
from taehv_console.core.models import CommandResult, NodeFacts, ProbeResult

PROBE_MODULE = "taehv_console.core.cluster.probe"


def node_path(path: str) -> str:
    """A path as every node should read it: relative paths are taken from the console's working
    directory (a node's SSH session starts in its home instead); `~` is left for the node."""
    return path if path.startswith("~") else os.path.abspath(path)


def probe_argv(python: str, paths: Mapping[str, str] | None = None) -> list[str]:
    argv = [python, "-m", PROBE_MODULE]
    for label, path in (paths or {}).items():
        argv += ["--path", f"{label}={path}"]
    return argv


def clock_offset(remote_clock: float, sent_at: float, received_at: float) -> float:
    """The node's clock minus ours, as far as one round trip can tell: the node read its clock
    somewhere between sending and receiving, so only a reading outside that window is an offset."""
    if remote_clock > received_at:
        return remote_clock - received_at
    if remote_clock < sent_at:
        return remote_clock - sent_at
    return 0.0


def result_from_command(host: str, result: CommandResult | BaseException, python: str) -> ProbeResult:
    if isinstance(result, SshError):
        return ProbeResult(host=host, error=str(result), fix=result.fix)
    if isinstance(result, (InvalidHostError, CommandError)):
        return ProbeResult(host=host, error=f"{host}: {result}", fix="fix the host name in the hostfile")
    if isinstance(result, BaseException):
        return ProbeResult(host=host, error=f"{host}: {type(result).__name__}: {result}")
    if result.exit_status != 0:
        tail = (result.stderr.strip() or result.stdout.strip())[-400:]
        if result.exit_status == 127 or "No such file or directory" in tail:
            fix = f"{python} is not on {host}: pass --python with the node's interpreter"
        elif "No module named" in tail:
            fix = f"install taehv-console for {python} on {host} (pip install -e . in the project)"
        else:
            fix = "run the probe by hand on the node to see the full error"
        return ProbeResult(host=host, error=f"{host}: probe failed (exit {result.exit_status}): {tail}",
                           fix=fix, seconds=result.seconds)
    try:
        line = result.stdout.strip().splitlines()[-1]
        facts = NodeFacts.from_dict(json.loads(line))
    except (IndexError, ValueError, TypeError) as err:
        return ProbeResult(host=host, error=f"{host}: probe printed no facts ({err}): {result.stdout[-200:]!r}",
                           fix="check the node's login scripts: they must not print to stdout",
                           seconds=result.seconds)
    received = result.started_at + result.seconds
    return ProbeResult(host=host, facts=facts, seconds=result.seconds,
                       clock_offset_s=round(clock_offset(facts.clock, result.started_at, received), 3))


def probe_runner(runner: NodeRunner, paths: Mapping[str, str] | None = None,
                 timeout: float | None = None) -> ProbeResult:
    try:
        result: CommandResult | BaseException = runner.run(probe_argv(runner.python, paths), timeout=timeout)
    except Exception as err:
        result = err
    return result_from_command(runner.host, result, runner.python)


def probe_hosts(
    hosts: Iterable[str],
    pool: SshPool,
    paths: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> tuple[ProbeResult, ...]:
    """Probe every host at once; one unreachable host is a ProbeResult with an error, never an
    exception, and never delays the others beyond the connect timeout."""
    hosts = list(hosts)
    t0 = time.monotonic()
    answers = {}
    valid = []
    for h in hosts:
        try:  # a bad name is a finding for that host; the others are still probed
            validate_host(h)
            valid.append(h)
        except InvalidHostError as err:
            answers[h] = ProbeResult(host=h, error=f"{h!r}: {err}", fix="fix the host name in the hostfile")
    found = pool.map(valid, lambda r: probe_runner(r, paths, timeout))
    for h, r in found.items():
        if isinstance(r, ProbeResult):
            answers[h] = r
        else:
            answers[h] = result_from_command(h, r, pool.settings.python)
            if not answers[h].seconds:
                answers[h] = ProbeResult(host=h, error=answers[h].error, fix=answers[h].fix,
                                         seconds=time.monotonic() - t0)
    return tuple(answers[h] for h in hosts)
