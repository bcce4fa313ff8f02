"""Facts of many nodes in one round: the probe module run on every node at once, each answer
turned into a ProbeResult (facts, or what went wrong and the fix), with the node's clock offset.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace

from taehv_console.core.cluster.hosts import InvalidHostError, validate_host
from taehv_console.core.cluster.nodecall import NodeReply
from taehv_console.core.cluster.ssh import NodeRunner, SshPool
from taehv_console.core.models import NodeFacts, ProbeResult

PROBE_MODULE = "taehv_console.core.cluster.probe"


def node_path(path: str) -> str:
    """A path as every node should read it: relative paths are taken from the console's working
    directory (a node's SSH session starts in its home instead); `~` is left for the node."""
    return path if path.startswith("~") else os.path.abspath(path)


def probe_args(paths: Mapping[str, str] | None = None) -> list[str]:
    return [a for label, path in (paths or {}).items() for a in ("--path", f"{label}={path}")]


def clock_offset(remote_clock: float, sent_at: float, received_at: float) -> float:
    """The node's clock minus ours, as far as one round trip can tell: the node read its clock
    somewhere between sending and receiving, so only a reading outside that window is an offset."""
    if remote_clock > received_at:
        return remote_clock - received_at
    if remote_clock < sent_at:
        return remote_clock - sent_at
    return 0.0


def result_from_reply(reply: NodeReply) -> ProbeResult:
    """The probe's reply as a ProbeResult: facts with the node's clock offset, or the error."""
    if not reply.ok:
        assert reply.error is not None
        return ProbeResult(
            host=reply.host, error=str(reply.error), fix=reply.error.fix, seconds=reply.elapsed_s
        )
    try:
        facts = NodeFacts.from_dict(dict(reply.data))
    except (ValueError, TypeError, KeyError) as err:
        return ProbeResult(
            host=reply.host,
            error=f"{reply.host}: {reply.helper}: its facts do not read: {err}",
            fix="check that the node runs the same taehv-console version",
            seconds=reply.elapsed_s,
        )
    received = reply.started_at + reply.elapsed_s
    return ProbeResult(
        host=reply.host,
        facts=facts,
        seconds=reply.elapsed_s,
        clock_offset_s=round(clock_offset(facts.clock, reply.started_at, received), 3),
    )


def probe_runner(
    runner: NodeRunner, paths: Mapping[str, str] | None = None, timeout: float | None = None
) -> ProbeResult:
    return result_from_reply(runner.call(PROBE_MODULE, probe_args(paths), timeout=timeout))


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
    replies = pool.call_all(valid, PROBE_MODULE, probe_args(paths), timeout=timeout)
    for h, reply in replies.items():
        answers[h] = result_from_reply(reply)
        if not answers[h].seconds:  # never reached: how long finding that out took
            answers[h] = replace(answers[h], seconds=time.monotonic() - t0)
    return tuple(answers[h] for h in hosts)
