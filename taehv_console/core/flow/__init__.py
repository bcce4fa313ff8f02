"""The console's flow as one typed API over core: detect -> choose config -> preflight -> launch
plan -> review, plus which run is live and host-key trust. The TUI, `--no-tui` and the CLI
commands all call these; they take a FlowOptions value, never a front end's arguments."""

from taehv_console.core.flow.config import (
    FORM_FIELDS,
    ChosenConfig,
    PresetChoice,
    check_overrides,
    choose_config,
    field_text,
    form_overrides,
    override_text,
    preset_choices,
    run_config,
)
from taehv_console.core.flow.detect import Detection, detect, hostfile_topology, probe_each, probe_paths
from taehv_console.core.flow.launch import (
    NodeLaunch,
    PlatformNode,
    PlatformRunError,
    Review,
    launch_spec,
    prepare_platform_node,
    review,
    reviewed_run_dir,
)
from taehv_console.core.flow.options import EnvError, FlowOptions, parse_env
from taehv_console.core.flow.preflight import (
    NOT_PER_PROCESS,
    PreflightResult,
    assumed_gbps,
    backend_for,
    master_port,
    preflight,
)
from taehv_console.core.flow.runs import (
    RunEntry,
    any_alive,
    find_live_run,
    list_run_entries,
    newest_unended_run,
    run_entry,
)
from taehv_console.core.flow.trust import HostKeyOffer, TrustOutcome, needs_trust, offer_host_key, trust_offered_key
from taehv_console.core.run.backends import BackendKind

__all__ = [
    "FORM_FIELDS", "NOT_PER_PROCESS", "BackendKind", "ChosenConfig", "Detection", "EnvError", "FlowOptions",
    "HostKeyOffer", "NodeLaunch", "PlatformNode", "PlatformRunError", "PreflightResult", "PresetChoice", "Review",
    "RunEntry", "TrustOutcome", "any_alive", "assumed_gbps", "backend_for", "check_overrides", "choose_config",
    "detect", "field_text", "find_live_run", "form_overrides", "hostfile_topology", "launch_spec",
    "list_run_entries", "master_port", "needs_trust", "newest_unended_run", "offer_host_key", "override_text",
    "parse_env", "prepare_platform_node", "preflight", "preset_choices", "probe_each", "probe_paths", "review",
    "reviewed_run_dir", "run_config", "run_entry", "trust_offered_key",
]
