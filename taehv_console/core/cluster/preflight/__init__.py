"""Preflight: the cluster checked against a RunConfig before anything starts. Each check is a pure
function of recorded values (Topology, NodeFacts, TrainConfig, results of node-side tests) that
returns Findings; `run_preflight` gathers those values over the node runners and calls them all.
Errors stop a launch; warnings are shown and do not.

Re-exports the names the rest of the console uses; each lives in one submodule: findings
(severities and report order), devices, software, network, data and storage (the checks, by what
they look at), orchestrate (the round that gathers the values and runs every check).
"""

from __future__ import annotations

from taehv_console.core.cluster.preflight.data import check_data, check_loader, check_recipe
from taehv_console.core.cluster.preflight.devices import (
    check_compile,
    check_gpu_homogeneity,
    check_memory_fit,
    check_processes_vs_gpus,
    check_visible_devices,
)
from taehv_console.core.cluster.preflight.findings import E, I, W, sort_findings
from taehv_console.core.cluster.preflight.network import (
    bandwidth_finding,
    check_master_port,
    check_reachability,
)
from taehv_console.core.cluster.preflight.orchestrate import (
    NODECHECK,
    PreflightOptions,
    first_free_port,
    port_free,
    run_preflight,
)
from taehv_console.core.cluster.preflight.software import (
    CLOCK_SKEW_LIMIT_S,
    check_clock_skew,
    check_nccl_env,
    check_version_skew,
)
from taehv_console.core.cluster.preflight.storage import check_disk, check_runs_shared, checkpoint_bytes
from taehv_console.core.models import Finding, PreflightReport

__all__ = [
    "CLOCK_SKEW_LIMIT_S",
    "NODECHECK",
    "E",
    "Finding",
    "I",
    "PreflightOptions",
    "PreflightReport",
    "W",
    "bandwidth_finding",
    "check_clock_skew",
    "check_compile",
    "check_data",
    "check_disk",
    "check_gpu_homogeneity",
    "check_loader",
    "check_master_port",
    "check_memory_fit",
    "check_nccl_env",
    "check_processes_vs_gpus",
    "check_reachability",
    "check_recipe",
    "check_runs_shared",
    "check_version_skew",
    "check_visible_devices",
    "checkpoint_bytes",
    "first_free_port",
    "port_free",
    "run_preflight",
    "sort_findings",
]
