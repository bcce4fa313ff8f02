"""Launch files for a resolved config: run.toml, deepspeed.json, per-node accelerate YAML, DeepSpeed
hostfile, a SLURM sbatch script and a Kubernetes Indexed Job.

Each renderer is a pure function returning text; `write_launch_files` puts them in a run directory.
deepspeed.json comes from trainer.ds_config.build_deepspeed_config, the builder the trainer uses,
so what is rendered is what DeepSpeed gets.

The platforms retry by the console's exit codes (taehv_console/exit_codes.py): the Kubernetes Job
retries a pod that failed in a way another try may get past and fails at once on a usage error,
a failed preflight or a final failure; the sbatch job is requeued when a node fails or it is
preempted, never for its own non-zero exit, and a requeued job goes on from its newest checkpoint.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from taehv_console.core.hostnames import validate_host
from taehv_console.core.plan.flight_recorder import FR_DIR, flight_recorder_env
from taehv_console.core.values import InputError
from taehv_console.exit_codes import ExitCode
from trainer.checkpoint import COMPLETE
from trainer.config import ENV_NAME_RE, TrainConfig, config_to_toml
from trainer.ds_config import build_deepspeed_config

RUN_TOML = "run.toml"
DEEPSPEED_JSON = "deepspeed.json"
HOSTFILE = "hostfile"
SBATCH = "sbatch.sh"
K8S_JOB = "k8s-job.yaml"
DEFAULT_PORT = 29500
CHECKPOINTS = "checkpoints"  # the trainer's checkpoint root in a run directory (RunDir.checkpoints)

# Exit codes of the console that another try would repeat: the command line, a config or the
# environment is wrong, preflight found errors, or the failure is final (a trainer error, bad data,
# a full disk; or the console's own restarts gave up), or the console crashed (a bug, which another
# try would meet again). A platform must not retry them.
FINAL_EXIT_CODES = (ExitCode.USAGE, ExitCode.PREFLIGHT_FAILED, ExitCode.FAILED_FINAL, ExitCode.CRASHED)
K8S_CONTAINER = "taehv"  # the pod's one container: the failure policy matches its exit codes
# Kubernetes' own default backoffLimit, granted here per node: see k8s_manifests
K8S_RETRIES_PER_NODE = 6
# how long past the console's stop grace a pod may take between SIGTERM and SIGKILL: the console
# then kills what is left, waits for the ranks' last words and verifies the checkpoint
K8S_STOP_MARGIN_S = 60


def accelerate_config_name(node: int | str) -> str:
    """One accelerate YAML per node: they differ only in machine_rank, which accelerate reads from
    the file (a single accelerate.yaml would need a --machine_rank on every command line)."""
    return f"accelerate-node-{node}.yaml"


@dataclass(frozen=True)
class RenderOptions:
    """Where the files live and how the nodes find each other.

    run_dir: the run directory as every node sees it (shared storage); paths inside the files
        point there, so render with the path the nodes will use.
    hosts: one host per node, node 0 (the main process) first. Empty: "localhost" on one node,
        placeholders node-0 ... on several (the files say so; `render` warns).
    """

    run_dir: str
    hosts: tuple[str, ...] = ()
    main_process_ip: str = ""  # default: hosts[0] (127.0.0.1 for a one-node run without hosts)
    main_process_port: int = DEFAULT_PORT
    job_name: str = ""  # default: from run.name and the preset
    image: str = "taehv-console:latest"  # container image for Kubernetes
    k8s_namespace: str = "default"
    k8s_volume_claim: str = "taehv-shared"  # a ReadWriteMany claim holding runs and data
    k8s_mount_path: str = "/shared"
    # what each pod runs; default `taehv-console --no-tui --preset <run_dir>/run.toml`
    k8s_command: tuple[str, ...] = ()

    def resolved_hosts(self, nodes: int) -> tuple[str, ...]:
        if self.hosts:
            if len(self.hosts) != nodes:
                raise InputError(
                    f"{len(self.hosts)} host(s) given for a {nodes}-node config; give one host per node"
                )
            for host in self.hosts:  # they are written into hostfiles and launch commands
                validate_host(host)
            return self.hosts
        return ("localhost",) if nodes == 1 else tuple(f"node-{i}" for i in range(nodes))

    def main_ip(self, nodes: int) -> str:
        if self.main_process_ip:
            return validate_host(self.main_process_ip)
        if not self.hosts and nodes == 1:
            return "127.0.0.1"
        return self.resolved_hosts(nodes)[0]

    def placeholders(self, nodes: int) -> bool:
        return not self.hosts and nodes > 1 and not self.main_process_ip


def job_name(cfg: TrainConfig, opts: RenderOptions) -> str:
    """A name Kubernetes and SLURM accept: lower-case DNS label, at most 50 characters."""
    raw = opts.job_name or f"{cfg.run.name}-{cfg.run.preset}"
    name = re.sub(r"[^a-z0-9-]+", "-", raw.lower()).strip("-")[:50].strip("-")
    return name or "taehv"


def render_run_toml(cfg: TrainConfig) -> str:
    return config_to_toml(cfg)


def render_deepspeed_json(cfg: TrainConfig) -> str:
    return json.dumps(build_deepspeed_config(cfg, cfg.topology.device), indent=2) + "\n"


def accelerate_config(cfg: TrainConfig, node: int, opts: RenderOptions) -> dict:
    """The accelerate config for machine `node` as a dict (render_accelerate_yaml writes it)."""
    t = cfg.topology
    if not 0 <= node < t.nodes:
        raise ValueError(f"node {node}: a {t.nodes}-node config has machine ranks 0..{t.nodes - 1}")
    deepspeed = {
        "deepspeed_config_file": str(Path(opts.run_dir) / DEEPSPEED_JSON),
        # each node runs its own torchrun; the console (or srun, or the pod) does the fan-out.
        # Without this accelerate hands machine rank 0 to DeepSpeed's pdsh launcher.
        "deepspeed_multinode_launcher": "standard",
        # the model is built whole on every rank (11.3M parameters); zero.Init is for models that
        # do not fit one device
        "zero3_init_flag": False,
    }
    return {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": deepspeed,
        # No mixed_precision key: with deepspeed_config_file accelerate refuses one (it would be
        # ignored); the precision is deepspeed.json's bf16/fp16 blocks, and accelerate reports it
        # from there. use_cpu below is consistent with that file's fp32 on CPU.
        "machine_rank": node,
        "num_machines": t.nodes,
        "num_processes": t.world_size,  # all processes of all nodes, not per node
        "main_process_ip": opts.main_ip(t.nodes),
        "main_process_port": opts.main_process_port,
        "rdzv_backend": "static",  # a fixed world: every node is started by the console, none join later
        "use_cpu": t.device == "cpu",
        "gpu_ids": "all",
        "main_training_function": "main",
        "debug": False,
        "enable_cpu_affinity": False,
    }


def render_accelerate_yaml(cfg: TrainConfig, node: int, opts: RenderOptions) -> str:
    header = f"# accelerate config for node {node} of {cfg.topology.nodes} (machine rank {node})\n"
    if opts.placeholders(cfg.topology.nodes):
        header += "# main_process_ip is a placeholder: render with --hosts to name the real node 0\n"
    return header + yaml.safe_dump(accelerate_config(cfg, node, opts), sort_keys=False)


def render_hostfile(cfg: TrainConfig, opts: RenderOptions) -> str:
    """DeepSpeed hostfile: `host slots=N`, one line per node, node 0 first."""
    t = cfg.topology
    lines = [f"# {t.nodes} node(s) x {t.gpus_per_node} slot(s); node 0 runs the main process"]
    if opts.placeholders(t.nodes):
        lines.append("# placeholders: replace node-<i> with your hosts, or render with --hosts")
    lines += [f"{host} slots={t.gpus_per_node}" for host in opts.resolved_hosts(t.nodes)]
    return "\n".join(lines) + "\n"


def trainer_command(run_dir: str) -> list[str]:
    """What accelerate launches on every process: `python -m trainer.cli` (the `taehv-train`
    entry point) with accelerate's own interpreter, so a node needs no venv on its PATH."""
    return ["-m", "trainer.cli", "--run", run_dir]


# accelerate's launch module, run as `accelerate launch` runs it but without accelerate's CLI
# wrapper: that one imports every subcommand first, `estimate` with transformers among them, 0.8 of
# the launcher's ~2.5 CPU-s before it starts torchrun (benchmarks/smoke_start.py). "python" is the
# node wrapper's own interpreter (core/run/node.py), the one `accelerate` beside it would run.
LAUNCHER = ("python", "-m", "accelerate.commands.launch")


def launch_command(cfg: TrainConfig, node: int, opts: RenderOptions) -> list[str]:
    """`accelerate launch` for one node, as argv (the SSH backend quotes it with shlex.join)."""
    config_file = str(Path(opts.run_dir) / accelerate_config_name(node))
    return [*LAUNCHER, "--config_file", config_file, *trainer_command(opts.run_dir)]


def launch_env(cfg: TrainConfig, run_dir: str | None = None) -> dict[str, str]:
    """Environment every node's launcher needs: the config's NCCL settings, and on CPU the switch
    that makes DeepSpeed use its CPU accelerator (it would look for CUDA otherwise). With the run
    directory, an NCCL run also gets Flight Recorder's dump pipe and dump files (core/forensics);
    the config's own nccl_env wins over those."""
    env = flight_recorder_launch_env(cfg, run_dir) if run_dir else {}
    env.update(cfg.distributed.nccl_env)
    if cfg.topology.device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    return env


def flight_recorder_launch_env(cfg: TrainConfig, run_dir: str | Path) -> dict[str, str]:
    """Flight Recorder's variables for an NCCL run (nothing for gloo: it has no dump pipe)."""
    return flight_recorder_env(run_dir) if cfg.topology.device == "cuda" else {}


def export_lines(env: Mapping[str, str]) -> list[str]:
    """`export KEY='value'` lines for a shell script: the one place rendered scripts get their
    environment. Keys are checked again here (not only by the schema) because a caller may build
    `env` by hand; every value is quoted, so `$(...)`, backticks and `;` stay text."""
    lines = []
    for key, value in sorted(env.items()):
        if not ENV_NAME_RE.fullmatch(key):
            raise InputError(
                f"environment variable name {key!r} is not a POSIX name; refused in a launch script"
            )
        lines.append(f"export {key}={shlex.quote(value)}")
    return lines


def _env_lines(cfg: TrainConfig, run_dir: str) -> list[str]:
    return export_lines(launch_env(cfg, run_dir))


PREFLIGHT_DIR = "preflight"
# The node wrapper every launcher runs under (core/run/node.py): named here, below the launch
# backends that also start it, so the rendered sbatch script and the backends say the same.
NODE_MODULE = "taehv_console.core.run.node"


def slurm_filename(path: str) -> str:
    """A path as srun's and sbatch's --output take it: SLURM reads `%` there as a filename pattern
    (%j the job id, %n the node), so a `%` of the path itself is written `%%`. A backslash would
    turn every pattern off (SLURM then keeps the name as written), so it is refused."""
    if "\\" in path:
        raise InputError(f"path {path!r}: a backslash turns off SLURM's output file patterns; rename it")
    return path.replace("%", "%%")


def sbatch_directive_value(value: str, what: str) -> str:
    """A value for an `#SBATCH` line. sbatch reads those lines itself, not bash: whitespace ends an
    argument, an unquoted `#` starts a comment, '...' or "..." group (the quotes are removed) and a
    backslash keeps the next character, inside quotes too. So the value goes in double quotes with
    `\\` and `"` escaped; a line break cannot be written at all."""
    if any(c in value for c in "\n\r\0"):
        raise InputError(f"{what} {value!r}: a line break cannot be written in an #SBATCH line")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def comment_text(text: str) -> str:
    """Text for a `# ...` line of a script: a control character (a line break above all, which
    would end the comment and make the rest a command) is written as `?`."""
    return re.sub(r"[\x00-\x1f\x7f]", "?", text)


def _srun_node_step(run_dir: str, nodes: int, status: str, command: str, kill_on_bad_exit: bool) -> list[str]:
    """One srun step with one task per node, each under the node wrapper: it records the task's
    identity and exit status in `status` (`{node}` filled from SLURM_NODEID, as for the in-allocation
    backend), and its output goes to the node's log, where the console reads why a node failed."""
    q = shlex.quote
    flags = "--kill-on-bad-exit=1 " if kill_on_bad_exit else ""
    return [
        f"srun {flags}--nodes={nodes} --ntasks-per-node=1 --output={q(slurm_filename(run_dir) + '/logs/node-%n.log')} --open-mode=append \\",
        f'  "$PYTHON" -m {NODE_MODULE} launch --status {q(status)} --node-env SLURM_NODEID --attempt "$ATTEMPT" -- \\',
        f"  {command}",
    ]


def _requeue_lines(run_dir: str) -> list[str]:
    """How the job retries, and how a requeued job continues: from the newest checkpoint once this
    job has written one (this try's start would repeat the submitted one: a fresh start, or a
    resume from a checkpoint this job has since gone past), else as submitted."""
    q = shlex.quote
    final = ", ".join(f"{int(c)} {c.name.lower()}" for c in FINAL_EXIT_CODES)
    return [
        "# Retries. With --requeue SLURM requeues this job when one of its nodes fails or it is",
        "# preempted, and runs this script again from the top, with the environment it was submitted",
        "# with and SLURM_RESTART_COUNT set to the number of restarts. A job that ends with a non-zero",
        "# exit of its own is not requeued: SLURM does that only for the codes slurm.conf's RequeueExit",
        "# (or RequeueExitHold) names, so keep the console's final codes out of those:",
        f"# {final}. A final failure ends the job for good:",
        f"# preflight's errors end the script with code {int(ExitCode.PREFLIGHT_FAILED)} below; a trainer error fails",
        "# the training step and the script with it; the console that submitted this job watches it",
        f"# from the login node, exits {int(ExitCode.FAILED_FINAL)} itself when the failure is final, and cancels the job",
        "# if it is still queued or running (SLURM never requeues a cancelled job).",
        "# No --no-kill: the world size is fixed, so the nodes left after one fails cannot train on;",
        "# the allocation ending is what lets SLURM requeue the job onto healthy nodes.",
        # (run by hand, outside SLURM, there is no job id and never a restart)
        f'STARTED={q(run_dir + "/logs")}/"slurm-${{SLURM_JOB_ID:-local}}.started"',
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && [ -e "$STARTED" ]; then',
        "  # a checkpoint completed after this job first started is this job's: go on from the newest",
        f"  for f in {q(run_dir + '/' + CHECKPOINTS)}/step-*/{COMPLETE}; do",
        f'    d="${{f%/{COMPLETE}}}"',
        '    if [[ "${d##*/}" =~ ^step-[0-9]+$ ]] && [ "$f" -nt "$STARTED" ]; then RESUME=(--resume latest); fi',
        "  done",
        '  echo "requeued (restart $SLURM_RESTART_COUNT): taehv-train gets: ${RESUME[*]:-no resume}" >&2',
        "else",
        '  touch "$STARTED"',
        "fi",
    ]


def render_sbatch(cfg: TrainConfig, opts: RenderOptions) -> str:
    """An sbatch script: preflight on the allocation (every node checks itself; an error stops the
    job before training), then one task per node, each running accelerate with its own node's config.

    The console submits it with TAEHV_PYTHON (its interpreter), TAEHV_ATTEMPT and, for a resume,
    TAEHV_RESUME (`latest` or a checkpoint) and TAEHV_WEIGHTS_ONLY=1; submitted by hand, `python3`
    from PATH, attempt 1 and a fresh start stand in. SLURM requeues the job when a node fails or it
    is preempted; the requeued job resumes from the newest checkpoint it wrote (_requeue_lines)."""
    t = cfg.topology
    run_dir = opts.run_dir
    q = shlex.quote
    name = job_name(cfg, opts)
    gpu_line = [f"#SBATCH --gpus-per-node={t.gpus_per_node}"] if t.device == "cuda" else []
    preflight_dir = f"{run_dir}/{PREFLIGHT_DIR}"
    preflight_cmd = (
        f'"$PYTHON" -m taehv_console.cli preflight --preset {q(str(Path(run_dir) / RUN_TOML))}'
        f' --runs {q(str(Path(run_dir).parent))} --master-port "$MASTER_PORT"'
        f" --report {q(preflight_dir + '/node-{node}.json')}"
    )
    # machine rank = the node's config file (machine_rank in it); master = first host of the allocation
    train_cmd = (
        '"$PYTHON" -m accelerate.commands.launch'
        f" --config_file {q(str(Path(run_dir) / accelerate_config_name('{node}')))}"
        ' --main_process_ip "$MASTER_ADDR" --main_process_port "$MASTER_PORT"'
        f" {shlex.join(trainer_command(run_dir))}"
        ' ${RESUME[@]+"${RESUME[@]}"}'
    )
    preflight = _srun_node_step(
        run_dir, t.nodes, preflight_dir + "/node-{node}.status.json", preflight_cmd, False
    )
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={t.nodes}",
        "#SBATCH --ntasks-per-node=1",  # one launcher per node; it starts one process per GPU
        *gpu_line,
        "#SBATCH --exclusive",
        # requeued when a node fails or the job is preempted (see "Retries" below)
        "#SBATCH --requeue",
        # quoted for sbatch's own parser: a space or `#` in the path would end the directive
        f"#SBATCH --output={sbatch_directive_value(slurm_filename(run_dir) + '/logs/slurm-%j.out', 'run directory')}",
        # a requeued job keeps its id: append, or its output file starts over and the first try's is lost
        "#SBATCH --open-mode=append",
        "",
        (
            f"# {comment_text(cfg.run.preset)}: {t.nodes} node(s) x {t.gpus_per_node} {'GPUs' if t.device == 'cuda' else 'CPU processes'}"
            f" = {t.world_size} processes"
        ),
        "set -euo pipefail",
        'PYTHON="${TAEHV_PYTHON:-python3}"',
        'ATTEMPT="${TAEHV_ATTEMPT:-1}"',
        "RESUME=()",
        'if [ -n "${TAEHV_RESUME:-}" ]; then RESUME+=(--resume "$TAEHV_RESUME"); fi',
        'if [ -n "${TAEHV_WEIGHTS_ONLY:-}" ]; then RESUME+=(--weights-only); fi',
        # the Flight Recorder folder too: torch's dump writer does not create it
        f"mkdir -p {q(run_dir + '/logs')} {q(preflight_dir)}"
        + (f" {q(run_dir + '/' + FR_DIR + '/live')}" if t.device == "cuda" else ""),
        'export MASTER_ADDR="$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | head -n 1)"',
        f"export MASTER_PORT={opts.main_process_port}",
        *_env_lines(cfg, run_dir),
        "",
        *_requeue_lines(run_dir),
        "",
        "# Preflight on the nodes SLURM gave: each checks itself (packages, data, runs directory, disk,",
        "# memory; node 0 its master port). Every node finishes, so all findings are kept.",
        "if ! " + preflight[0],
        *preflight[1:],
        "then",
        "  # the console reads each node's status file: the preflight's exit becomes the node's, so the",
        "  # run fails naming the node, with the findings from its log",
        f"  for f in {q(preflight_dir)}/node-*.status.json; do",
        # none when srun could not start the step: the job still ends with preflight's code
        '    [ -e "$f" ] || continue',
        f'    mv -f "$f" {q(run_dir + "/logs")}/"$(basename "$f")"',
        "  done",
        f'  echo "preflight found errors on the allocation; training was not started. Reports:" {q(preflight_dir)} >&2',
        f"  exit {int(ExitCode.PREFLIGHT_FAILED)}",
        "fi",
        "",
        "# --kill-on-bad-exit: one node failing ends the others now, not at the collective timeout",
        *_srun_node_step(run_dir, t.nodes, run_dir + "/logs/node-{node}.status.json", train_cmd, True),
        "",
    ]
    return "\n".join(lines)


def k8s_pod_failure_policy(container: str = K8S_CONTAINER) -> dict:
    """The Job's podFailurePolicy: which pod failures Kubernetes retries, by the console's exit code.

    Rules are evaluated in order and the first that matches decides; a failure no rule matches is
    counted against backoffLimit and the pod is replaced. A pod with the DisruptionTarget condition
    (preempted, evicted, drained, its node shut down or gone) is replaced without counting, whatever
    the console exited with: its failure is the disruption's, not the run's. A final exit code fails
    the whole Job at once: another pod would fail the same way. FailJob and not FailIndex (which
    needs backoffLimitPerIndex): no node of a run can finish without the others.
    """
    return {
        "rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {
                "action": "FailJob",
                # the API wants them ordered, without duplicates, and never 0 with In
                "onExitCodes": {
                    "containerName": container,
                    "operator": "In",
                    "values": sorted({int(code) for code in FINAL_EXIT_CODES}),
                },
            },
        ]
    }


def k8s_manifests(cfg: TrainConfig, opts: RenderOptions) -> list[dict]:
    """A headless Service (stable pod DNS names) and an Indexed Job with one pod per node.

    Each pod runs `taehv-console --no-tui` with the run.toml; the environment follows the
    node-level platform convention (PAI-DLC, Kubeflow): WORLD_SIZE = number of nodes, RANK = this
    pod's completion index, MASTER_ADDR = pod 0's DNS name, MASTER_PORT; Kubernetes itself adds
    JOB_COMPLETION_INDEX.

    Kubernetes is the run's supervisor here (a pod's console starts none): a pod that failed is
    replaced, and its console resumes from the newest checkpoint, unless its exit code says a retry
    would repeat the failure (k8s_pod_failure_policy).
    """
    t = cfg.topology
    name = job_name(cfg, opts)
    service = f"{name}-nodes"

    def labels() -> dict:
        # a fresh dict each time: a shared one would come out as a YAML anchor and alias
        return {"app.kubernetes.io/name": "taehv-console", "taehv-console/job": name}

    env = [
        {"name": "WORLD_SIZE", "value": str(t.nodes)},
        {
            "name": "RANK",
            "valueFrom": {
                "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
            },
        },
        {"name": "MASTER_ADDR", "value": f"{name}-0.{service}.{opts.k8s_namespace}.svc.cluster.local"},
        {"name": "MASTER_PORT", "value": str(opts.main_process_port)},
        *({"name": k, "value": v} for k, v in sorted(launch_env(cfg, opts.run_dir).items())),
    ]
    resources: dict = {}
    if t.device == "cuda":
        resources = {"limits": {"nvidia.com/gpu": t.gpus_per_node}}
    container = {
        "name": K8S_CONTAINER,
        "image": opts.image,
        "command": list(opts.k8s_command)
        or ["taehv-console", "--no-tui", "--preset", str(Path(opts.run_dir) / RUN_TOML)],
        "env": env,
        "ports": [{"containerPort": opts.main_process_port, "name": "rendezvous"}],
        "resources": resources,
        "volumeMounts": [
            {"name": "shared", "mountPath": opts.k8s_mount_path},
            # NCCL and the data loader workers need more shared memory than the 64 MB default
            {"name": "dshm", "mountPath": "/dev/shm"},
        ],
    }
    pod_spec = {
        "subdomain": service,  # pods are <job>-<index>.<service>
        # a failed pod is replaced by the Job, not restarted in place: podFailurePolicy requires it
        "restartPolicy": "Never",
        # SIGTERM (deletion, eviction, preemption) stops the run like `taehv-console stop`: up to the
        # stop grace for the ranks' checkpoint, then the console's own cleanup. Kubernetes' default
        # of 30 s would SIGKILL the console in the middle of it.
        "terminationGracePeriodSeconds": int(cfg.schedule.stop_grace_s) + K8S_STOP_MARGIN_S,
        "containers": [container],
        "volumes": [
            {"name": "shared", "persistentVolumeClaim": {"claimName": opts.k8s_volume_claim}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": opts.k8s_namespace, "labels": labels()},
        "spec": {
            "completionMode": "Indexed",
            "completions": t.nodes,
            "parallelism": t.nodes,
            # Kubernetes' default of 6 retries, per node: one node's failure usually fails every pod
            # (each console sees the failed node's status and stops its own), and each of those
            # counts. Every replacement pod's console resumes from the newest checkpoint.
            "backoffLimit": K8S_RETRIES_PER_NODE * t.nodes,
            # With a podFailurePolicy a replacement pod starts only once the failed one is gone
            # (podReplacementPolicy Failed, the only value allowed with it): one pod per index.
            "podFailurePolicy": k8s_pod_failure_policy(K8S_CONTAINER),
            "template": {"metadata": {"labels": labels()}, "spec": pod_spec},
        },
    }
    svc = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service, "namespace": opts.k8s_namespace, "labels": labels()},
        "spec": {
            "clusterIP": "None",
            "selector": {"taehv-console/job": name},
            "ports": [{"name": "rendezvous", "port": opts.main_process_port}],
            # pod 0 must be resolvable before it is ready: the others connect while it starts
            "publishNotReadyAddresses": True,
        },
    }
    return [svc, job]


def render_k8s_job(cfg: TrainConfig, opts: RenderOptions) -> str:
    header = (
        f"# {cfg.run.preset}: {cfg.topology.nodes} pod(s), one per node; "
        f"run and data live on the claim {opts.k8s_volume_claim!r} mounted at {opts.k8s_mount_path}\n"
    )
    return header + yaml.safe_dump_all(k8s_manifests(cfg, opts), sort_keys=False)


UNSUBMITTABLE = "# taehv-console: this run cannot be submitted to SLURM: "


def render_sbatch_or_refusal(cfg: TrainConfig, opts: RenderOptions) -> str:
    """The sbatch script, or, for a run directory SLURM cannot write its output to (a line break or
    a backslash in the path), a script that says why and exits 2: the other backends do not need
    it, so the run is not refused for them; the sbatch backend refuses it before submitting."""
    try:
        return render_sbatch(cfg, opts)
    except InputError as err:
        why = comment_text(str(err))
        return f"#!/bin/bash\n{UNSUBMITTABLE}{why}\necho {shlex.quote(why)} >&2\nexit {int(ExitCode.USAGE)}\n"


def render_all(cfg: TrainConfig, opts: RenderOptions) -> dict[str, str]:
    """File name (relative to the run directory) -> content, for every launch file."""
    files = {
        RUN_TOML: render_run_toml(cfg),
        DEEPSPEED_JSON: render_deepspeed_json(cfg),
        HOSTFILE: render_hostfile(cfg, opts),
        SBATCH: render_sbatch_or_refusal(cfg, opts),
        K8S_JOB: render_k8s_job(cfg, opts),
    }
    for node in range(cfg.topology.nodes):
        files[accelerate_config_name(node)] = render_accelerate_yaml(cfg, node, opts)
    return files


def write_launch_files(
    cfg: TrainConfig, out_dir: str | Path, opts: RenderOptions | None = None
) -> list[Path]:
    """Write every launch file into `out_dir` (created if needed); paths inside point to
    opts.run_dir (default: out_dir itself, absolute). Returns the written paths."""
    out = Path(out_dir)
    if opts is None:
        opts = RenderOptions(run_dir=str(out.resolve()))
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all(cfg, opts).items():
        path = out / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)  # a reader never sees half a file
        if name == SBATCH:
            path.chmod(0o755)
        written.append(path)
    return written
