"""The wizard's steps as plain functions over core and the headless flow (detect -> preflight ->
preset -> review), returning immutable values the screens render. Thread workers call these;
nothing here imports Textual, so the same steps are testable without a screen.

`args` is the CLI's argparse namespace (the headless flow's options: --hosts, --preset, --data,
--runs, --set, --env, --master-port, --backend, SSH options); functions never change the caller's.
"""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Note = Callable[[str], None]


class _NoteView:
    """What headless' helpers call `view` (they only ever use .note)."""

    def __init__(self, note: Note | None):
        self._note = note or (lambda _t: None)

    def note(self, text: str) -> None:
        self._note(text)


def args_with(args: argparse.Namespace, **changes: Any) -> argparse.Namespace:
    new = copy.copy(args)
    new.overrides = list(getattr(args, "overrides", []) or [])
    for k, v in changes.items():
        setattr(new, k, v)
    return new


# ------------------------------------------------------------------------------------- runs

@dataclass(frozen=True)
class RunEntry:
    run_id: str
    path: str
    phase: str  # state.json's phase, "unreadable", or "no state"
    live: bool  # some process of its current attempt is alive (asked of its nodes)
    preset: str = ""


def list_run_entries(runs_dir: str, pool: Any, limit: int = 30) -> tuple[RunEntry, ...]:
    """Runs under runs_dir, newest first, each with its phase and whether anything of it runs."""
    from taehv_console.core.run.control import probe_live
    from taehv_console.core.run.rundir import list_runs
    from taehv_console.core.run.state import StateError

    out = []
    for run in list_runs(runs_dir)[:limit]:
        if not run.has_state():
            out.append(RunEntry(run.run_id, str(run.path), "no state", False))
            continue
        try:
            state, procs = probe_live(run, pool)
        except (StateError, OSError, ValueError) as err:
            out.append(RunEntry(run.run_id, str(run.path), f"unreadable: {err}"[:80], False))
            continue
        live = any(isinstance(p, Exception) or p for p in procs.values())
        out.append(RunEntry(run.run_id, str(run.path), state.phase.value, live))
    return tuple(out)


def find_live_run(runs_dir: str, pool: Any) -> RunEntry | None:
    """The newest run under runs_dir whose current attempt still has processes: the run a console
    started on the head node attaches to instead of opening the wizard."""
    for entry in list_run_entries(runs_dir, pool, limit=20):
        if entry.live:
            return entry
    return None


# ----------------------------------------------------------------------------------- detect

def probe_paths(args: argparse.Namespace) -> dict[str, str]:
    from taehv_console.core.cluster.gather import node_path

    return {k: node_path(v) for k, v in (("runs", getattr(args, "runs", None)),
                                          ("data", getattr(args, "data", None))) if v}


def detect_hostfile(args: argparse.Namespace) -> Any:
    """The topology a hostfile describes (no node contacted yet). Raises TopologyError."""
    from taehv_console.core.cluster.platform import detect_topology

    return detect_topology(os.environ, args.hosts)


def probe_each(hosts: tuple[str, ...], pool: Any, paths: dict[str, str],
               on_result: Callable[[Any], None]) -> tuple[Any, ...]:
    """Probe every host at once (core's probe_hosts, one host per call) and report each result
    as it arrives, so a node table fills in while slow nodes are still answering."""
    from taehv_console.core.cluster.gather import probe_hosts

    results: dict[str, Any] = {}
    workers = max(1, min(len(hosts), getattr(pool.settings, "max_parallel", 64) or 64))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="taehv-probe") as ex:
        futures = {ex.submit(probe_hosts, [h], pool, paths): h for h in hosts}
        for fut in as_completed(futures):
            result = fut.result()[0]
            results[futures[fut]] = result
            on_result(result)
    return tuple(results[h] for h in hosts)


def detect_local(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...]]:
    """This machine (or the platform's env) probed in-process: (topology, probes)."""
    from taehv_console.commands.detect import detect

    topology, probes = detect(args_with(args, hosts=None))
    return topology, tuple(probes)


def trust_host(host: str, settings: Any) -> tuple[str, str]:
    """(fingerprint line, known_hosts path) of a host's key, before trusting it."""
    from taehv_console.core.cluster.ssh import fetch_host_key, sha256_fingerprint

    target, key = fetch_host_key(host, settings)
    return (f"{host} ({target.hostname} port {target.port}) presents {key.get_name()} {sha256_fingerprint(key)}",
            str(settings.known_hosts))


def add_trusted_host(host: str, settings: Any) -> str:
    """Add the key the host presents now to known_hosts (the user compared the fingerprint)."""
    from taehv_console.core.cluster.ssh import add_known_host, fetch_host_key, known_keys

    target, key = fetch_host_key(host, settings)
    known = known_keys(settings, target.known_name).get(key.get_name())
    if known is not None and known == key:
        return f"{host}: already trusted in {settings.known_hosts}"
    if known is not None:
        return (f"{host}: {settings.known_hosts} holds a different key for it; refused here. Check with the "
                f"node's admin, then: taehv-console trust --replace {host}")
    add_known_host(settings.known_hosts, target.known_name, key)
    return f"{host}: added to {settings.known_hosts}"


def needs_trust(result: Any) -> bool:
    """A probe refused because the host key is not known yet (the fix names `trust`)."""
    return not result.ok and "taehv-console trust " in (result.fix or "") and "--replace" not in (result.fix or "")


# -------------------------------------------------------------------------------- preflight

@dataclass(frozen=True)
class PreflightResult:
    config: Any  # TrainConfig the findings were checked against
    chosen: str  # how it was chosen (headless' words)
    report: Any  # PreflightReport
    backend: str | None
    master_port: int | None
    notes: tuple[str, ...] = ()


def backend_for(args: argparse.Namespace, topology: Any) -> str | None:
    from taehv_console.headless import _backend_for

    return args.backend if getattr(args, "backend", "auto") not in (None, "auto") else _backend_for(topology.source)


def config_for(args: argparse.Namespace, topology: Any, probes: Any, note: Note | None = None,
               preset: str | None = None, overrides: list[str] | None = None) -> tuple[Any, str]:
    """The run's config as the headless flow makes it (--preset or auto, --set, --data; generated
    clips for a CPU run without data), for `preset`/`overrides` when given."""
    from taehv_console.headless import _config

    changes: dict[str, Any] = {}
    if preset is not None:
        changes["preset"] = preset
    if overrides is not None:
        changes["overrides"] = list(overrides)
    return _config(args_with(args, **changes), topology, probes, None, _NoteView(note))


def preflight(args: argparse.Namespace, topology: Any, probes: Any, pool: Any, note: Note | None = None,
              config: tuple[Any, str] | None = None, bandwidth: bool = False) -> PreflightResult:
    """Config (unless given) then core's preflight on it, with headless' choice of master port;
    `bandwidth` also measures the all-reduce bandwidth between the nodes (a few seconds), which
    the review's communication figures then use instead of the assumed link."""
    from taehv_console.headless import _preflight

    notes: list[str] = []

    def say(text: str) -> None:
        notes.append(text)
        if note:
            note(text)

    cfg, chosen = config or config_for(args, topology, probes, say)
    a = args_with(args)
    if bandwidth:
        report = _preflight_with_bandwidth(a, topology, probes, cfg, pool, say)
    else:
        report = _preflight(a, topology, probes, cfg, pool, _NoteView(say))
    return PreflightResult(config=cfg, chosen=chosen, report=report, backend=backend_for(args, topology),
                           master_port=a.master_port, notes=tuple(notes))


def _preflight_with_bandwidth(a: argparse.Namespace, topology: Any, probes: Any, cfg: Any, pool: Any,
                              say: Note) -> Any:
    # headless' _preflight with bandwidth=True (its options take no bandwidth flag yet)
    from taehv_console.commands.preflight import _assumed_gbps
    from taehv_console.core.cluster.preflight import PreflightOptions, run_preflight
    from taehv_console.headless import _free_port

    if not a.master_port:
        a.master_port = (_free_port(topology, pool) if topology.source.value in ("local", "hostfile")
                         else topology.master_port)
    options = PreflightOptions(runs_dir=a.runs, data_source=cfg.data.source, master_port=a.master_port,
                               bandwidth=True, assumed_gbps=_assumed_gbps(cfg))
    return run_preflight(topology, cfg, pool, options, progress=say, probes=probes)


# ---------------------------------------------------------------------------------- presets

@dataclass(frozen=True)
class PresetChoice:
    name: str  # preset name, or "auto" for the one derived for this cluster
    title: str
    topology: str
    effective_batch: int | None
    lr: float | None
    zero_stage: int | None
    memory_gb: float | None
    device_gb: float | None
    fits: bool | None
    matches: bool  # made for the detected topology
    description: str = ""
    reasons: tuple[tuple[str, str], ...] = ()  # (key, why) of a derived config
    error: str = ""
    config: Any = None  # the TrainConfig (the form starts from its values)


def _choice(name: str, title: str, cfg: Any, matches: bool, description: str = "",
            reasons: tuple[tuple[str, str], ...] = ()) -> PresetChoice:
    from taehv_console.core.plan.planner import estimate_memory

    t = cfg.topology
    mem = estimate_memory(cfg)
    unit = "GPUs" if t.device == "cuda" else "CPU procs"
    return PresetChoice(name=name, title=title, topology=f"{t.nodes}×{t.gpus_per_node} {unit}",
                        effective_batch=cfg.effective_batch, lr=cfg.optim.lr, zero_stage=cfg.deepspeed.zero_stage,
                        memory_gb=round(mem.per_gpu_gb, 1), device_gb=mem.gpu_gb, fits=mem.fits, matches=matches,
                        description=description, reasons=reasons, config=cfg)


def preset_choices(args: argparse.Namespace, topology: Any, probes: Any) -> tuple[PresetChoice, ...]:
    """The config auto picks (or derives) for this cluster first, then every shipped and user
    preset, each with effective batch, LR, ZeRO stage and the memory estimate."""
    from taehv_console.commands.preflight import choose_config
    from taehv_console.core.plan.derive import auto_select
    from taehv_console.core.plan.presets import list_presets
    from trainer.config import ConfigError

    out: list[PresetChoice] = []
    a = args_with(args, preset="auto", overrides=[])
    want = None
    try:
        cfg, summary = choose_config(a, topology, probes)
        t = cfg.topology
        want = (t.nodes, t.gpus_per_node, t.device)
        reasons: tuple[tuple[str, str], ...] = ()
        try:
            gpu = next((p.facts.visible_gpus[0].name for p in probes if p.facts is not None and p.facts.visible_gpus), "")
            resolved = auto_select(t.nodes, t.gpus_per_node, device=t.device, gpu_name=gpu,
                                   gpu_memory_gb=t.gpu_memory_gb)
            reasons = tuple((r.key, r.reason) for r in resolved.reasons)
        except ConfigError:
            pass
        out.append(_choice("auto", "auto", cfg, True, summary.removeprefix("auto: "), reasons))
    except ConfigError as err:
        out.append(PresetChoice("auto", "auto", "", None, None, None, None, None, None, False,
                                error=str(err)))
    listing = list_presets()
    for p in listing.presets:
        t = p.config.topology
        out.append(_choice(p.name, p.name, p.config, (t.nodes, t.gpus_per_node, t.device) == want, p.meta.description))
    for err in listing.errors:
        out.append(PresetChoice("?", "user preset", "", None, None, None, None, None, None, False, error=err))
    return tuple(out)


# Fields the preset form offers; anything else goes in the free "more overrides" line.
FORM_FIELDS: tuple[tuple[str, str], ...] = (
    ("optim.max_steps", "max steps"),
    ("optim.batch_per_gpu", "batch per GPU"),
    ("optim.grad_accum", "grad accumulation"),
    ("optim.lr", "learning rate"),
    ("schedule.checkpoint_every", "checkpoint every"),
    ("data.source", "data source"),
)


def config_value(cfg: Any, dotted: str) -> Any:
    obj = cfg
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def field_text(cfg: Any, dotted: str) -> str:
    """A config value as the form shows it (and as an override would write it)."""
    value = config_value(cfg, dotted)
    if isinstance(value, float):
        return f"{value:g}"
    return "" if value is None else str(value)


def form_overrides(base: Any, fields: dict[str, str], more: str) -> list[str]:
    """--set entries for the form: each field whose text differs from `base`, then the free line
    (space-separated key=value)."""
    out = [override_text(k, v) for k, v in fields.items() if v.strip() != field_text(base, k)]
    return out + [item for item in shlex.split(more) if item]


def override_text(key: str, text: str) -> str:
    """`key=value` for a form field: strings quoted as TOML, numbers as typed."""
    import json

    text = text.strip()
    if key == "data.source":
        return f"{key}={json.dumps(text)}"
    return f"{key}={text}"


def check_overrides(cfg: Any, overrides: list[str]) -> tuple[Any, str]:
    """(config with the overrides, "") or (None, the validation message)."""
    from taehv_console.core.plan.presets import override_config
    from trainer.config import ConfigError

    try:
        return override_config(cfg, overrides), ""
    except (ConfigError, ValueError) as err:
        return None, str(err)


# ----------------------------------------------------------------------------------- review

@dataclass(frozen=True)
class NodeLaunch:
    node: int
    host: str
    command: str  # shell-quoted argv, exactly what the node's launcher runs


@dataclass(frozen=True)
class Review:
    plan: Any  # core Plan
    config: Any
    chosen: str
    run_id: str
    run_path: str
    created_at: float  # the run id's time: launch creates this very id
    backend: str
    hosts: tuple[str, ...]
    master: str
    master_port: int
    commands: tuple[NodeLaunch, ...]
    env: tuple[tuple[str, str], ...]
    findings: tuple[Any, ...] = ()  # preflight on this config when it differs from the checked one
    blocked: str = ""  # why a launch is refused ("" = ready)
    bandwidth: str = ""  # measured or assumed link


def launch_spec(args: argparse.Namespace, topology: Any, backend: str, master_port: int, pool: Any) -> Any:
    """Hosts and master for this topology, as the headless flow launches them."""
    from taehv_console.core.cluster.ssh import resolve_target
    from taehv_console.core.run.control import LaunchSpec
    from taehv_console.headless import parse_env

    if backend == "ssh":
        hosts = tuple(topology.hosts)
        first = hosts[0]
        master = first if first in ("localhost", "127.0.0.1") else resolve_target(first, pool.settings).hostname
    elif backend == "local":
        hosts, master = ("localhost",), "127.0.0.1"
    else:
        hosts, master = tuple(topology.hosts), topology.master_addr
    return LaunchSpec(backend=backend, hosts=hosts, master_addr=master, master_port=master_port or 29500,
                      env=parse_env(list(getattr(args, "launch_env", []) or [])))


def review(args: argparse.Namespace, topology: Any, probes: Any, checked: PreflightResult, cfg: Any, chosen: str,
           pool: Any, note: Note | None = None, now: float | None = None) -> Review:
    """The planner's figures and the exact per-node commands for `cfg`; preflight again when the
    config is not the one preflight checked (a changed preset or override can break the fit)."""
    from taehv_console.core.plan.planner import format_bandwidth, make_plan
    from taehv_console.core.plan.render import RenderOptions, launch_command, launch_env
    from taehv_console.core.run.rundir import new_run_id

    now = time.time() if now is None else now
    findings: tuple[Any, ...] = ()
    blocked = ""
    if cfg != checked.config:
        again = preflight(args, topology, probes, pool, note, config=(cfg, chosen))
        findings = again.report.findings
        if not again.report.ok:
            blocked = f"preflight found {len(again.report.errors)} error(s) for this config"
    elif not checked.report.ok:
        blocked = f"preflight found {len(checked.report.errors)} error(s)"
    if checked.backend is None:
        blocked = blocked or ("taehv-console runs once per node, not once per process: start it outside "
                              "torchrun/accelerate")
    gpu = ""
    for p in probes:
        if p.facts is not None and p.facts.visible_gpus:
            gpu = p.facts.visible_gpus[0].name
            break
    bw = checked.report.bandwidth
    bits = bw.busbw_gbps * 8e9 if bw is not None else None
    plan = make_plan(cfg, gpu=gpu, bandwidth_bits_per_s=bits)
    backend = checked.backend or "local"
    spec = launch_spec(args, topology, backend, checked.master_port or 29500, pool)
    run_id = new_run_id(cfg.run.preset, now)
    run_path = str(Path(args.runs).absolute() / run_id)
    opts = RenderOptions(run_dir=run_path)
    hosts = spec.hosts if len(spec.hosts) == cfg.topology.nodes else ("localhost",) * cfg.topology.nodes
    commands = tuple(NodeLaunch(i, hosts[i] if i < len(hosts) else "?", shlex.join(launch_command(cfg, i, opts)))
                     for i in range(cfg.topology.nodes))
    env = {**launch_env(cfg), **dict(spec.env)}
    link = format_bandwidth(bits) + " measured" if bits else (plan.comm.link + " (assumed)")
    return Review(plan=plan, config=cfg, chosen=chosen, run_id=run_id, run_path=run_path, created_at=now,
                  backend=backend, hosts=spec.hosts, master=spec.master_addr, master_port=spec.master_port,
                  commands=commands, env=tuple(sorted(env.items())), findings=findings, blocked=blocked,
                  bandwidth=link)


@dataclass
class WizardState:
    """What the wizard has found so far; each screen fills in its part."""

    topology: Any = None
    probes: tuple[Any, ...] = ()
    preflight: PreflightResult | None = None
    preset: str | None = None  # chosen on the preset screen ("auto" or a name)
    overrides: list[str] = field(default_factory=list)
    config: Any = None
    chosen: str = ""
    review: Review | None = None
