"""Hardware evidence from the per-node agents' samples: the nodes of a run whose GPUs say the
machine is bad (a GPU lost off the bus, uncorrectable ECC errors, GPUs or NVML gone since the node
was first seen, from NVML; a hardware Xid in the node's kernel log, from core/watch/kmsg.py). Pure
functions of a RunView; the run's recovery leaves such a node out at once.
"""

from __future__ import annotations

from collections.abc import Mapping

from taehv_console.core.watch.kmsg import HARDWARE_XIDS
from taehv_console.core.watch.nodesample import NodeSample
from taehv_console.core.watch.state import RunView


def first_gpu_counts(view: RunView, known: Mapping[str, int]) -> Mapping[str, int]:
    """`known` (node -> GPU count of its first sample with GPUs) with the nodes of `view` it lacks.
    A sample without GPUs is no baseline: NVML may not answer yet, or the node has none. Returns
    `known` itself when the view adds nobody, so a caller keeping it on every view copies nothing."""
    new = {
        n.name: len(n.sample.gpus)
        for n in view.nodes
        if n.name not in known and n.sample is not None and n.sample.gpus
    }
    return {**known, **new} if new else known


def hardware_evidence(view: RunView, first_gpus: Mapping[str, int] | None = None) -> dict[str, str]:
    """node -> one line of evidence that its hardware is bad, from its newest agent sample in `view`;
    nodes without any are absent. `first_gpus` (from `first_gpu_counts`, kept across views) adds
    GPUs gone since the first sample; without it that check is skipped.

    Only what a sample shows counts: a node whose agent is silent (LOST) or never answered has no
    evidence from that (the network or the console may be at fault), though what its last sample
    showed still stands. A GPU's Xid counts only on a node that has shown GPUs in this run, in this
    sample or (`first_gpus`) its first: the kernel log is the machine's, and on a node whose run has
    no GPU (a CPU run) an Xid is about something else (another job, a line written into the log),
    never what stopped this run."""
    out: dict[str, str] = {}
    for node in view.nodes:
        if node.sample is None:
            continue
        first = (first_gpus or {}).get(node.name)
        found = _evidence(node.sample, first)
        if found:
            out[node.name] = "; ".join(found)
    return out


def _evidence(sample: NodeSample, first: int | None) -> list[str]:
    found = []
    left = len(sample.gpus)  # 0 when NVML did not answer (gpu_ok false)
    if first is not None and left < first:
        why = f" ({sample.gpu_reason})" if not sample.gpu_ok and sample.gpu_reason else ""
        found.append(f"{left} of {first} GPUs left since the first sample{why}")
    for g in sample.gpus:
        if g.error:
            found.append(f"GPU {g.index}: {g.error}")
        elif g.ecc_uncorrected:  # None: no ECC on the board, or an agent too old to say
            n = g.ecc_uncorrected
            found.append(f"GPU {g.index}: {n} uncorrectable ECC error{'s' if n != 1 else ''}")
    if not sample.gpus and not first:
        return found  # no GPU seen on this node: no Xid can be its run's
    for code, pci in dict.fromkeys((x.code, x.pci) for x in sample.xids if x.code in HARDWARE_XIDS):
        found.append(f"Xid {code} on the GPU at PCI {pci}: {HARDWARE_XIDS[code]} (kernel log)")
    return found
