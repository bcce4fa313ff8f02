"""Rendered launch files, checked by the programs that consume them: accelerate's config loader and
launch path, DeepSpeed's config class, YAML parsers, bash, and the trainer's config loader."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
import yaml

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed picks its accelerator at import time

from taehv_console.core.plan.derive import derive_run_config
from taehv_console.core.plan.presets import load_preset, override_config
from taehv_console.core.plan.render import (
    LAUNCHER,
    RenderOptions,
    accelerate_config_name,
    launch_command,
    launch_env,
    render_all,
    render_hostfile,
    write_launch_files,
)
from trainer.config import load_config
from trainer.ds_config import build_deepspeed_config, zero1_runs_bf16_optimizer

ALL = ["1gpu-h100", "8gpu-h100", "16gpu-h100", "48gpu-h100", "64gpu-h100", "8gpu-a800", "cpu-smoke"]


def free_port() -> int:
    # other engineers' tests run on this machine too: never assume 29500 is free
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def preset(name):
    return load_preset(name, user_dir=None).config


@pytest.fixture
def rendered16(tmp_path):
    cfg = preset("16gpu-h100")
    opts = RenderOptions(
        run_dir=str(tmp_path), hosts=("127.0.0.1", "127.0.0.2"), main_process_port=free_port()
    )
    write_launch_files(cfg, tmp_path, opts)
    return cfg, opts, tmp_path


def test_every_file_is_written(rendered16):
    cfg, _, out = rendered16
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(
        ["run.toml", "deepspeed.json", "hostfile", "sbatch.sh", "k8s-job.yaml"]
        + [accelerate_config_name(i) for i in range(cfg.topology.nodes)]
    )
    assert not list(out.glob("*.tmp"))


def test_accelerate_loader_accepts_each_node_config(rendered16):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import DistributedType

    _cfg, opts, out = rendered16
    for node in range(2):
        loaded = load_config_from_file(str(out / accelerate_config_name(node)))
        assert isinstance(loaded, ClusterConfig)
        assert loaded.distributed_type == DistributedType.DEEPSPEED
        assert (loaded.machine_rank, loaded.num_machines) == (node, 2)
        assert loaded.num_processes == 16  # all processes of both nodes: 2 x 8, not 16 per node
        assert loaded.main_process_ip == "127.0.0.1" and loaded.main_process_port == opts.main_process_port
        assert loaded.deepspeed_config["deepspeed_config_file"] == str(out / "deepspeed.json")
        assert loaded.deepspeed_config["deepspeed_multinode_launcher"] == "standard"
        assert loaded.use_cpu is False
        # accelerate refuses a mixed_precision key next to a deepspeed_config_file (see below)
        assert loaded.mixed_precision is None


def test_accelerate_launch_path_takes_the_config_as_rendered(rendered16, monkeypatch):
    # accelerate's own `launch` logic up to the point it would start torchrun, for node 1
    from accelerate.commands import launch
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    cfg, opts, out = rendered16
    argv = launch_command(cfg, 1, opts)[len(LAUNCHER) :]  # drop the launcher
    args = launch.launch_command_parser().parse_args(argv)
    seen = {}
    with mock.patch.object(launch, "deepspeed_launcher", lambda a: seen.setdefault("args", a)):
        launch.launch_command(args)
    a = seen["args"]
    assert a.use_deepspeed and a.deepspeed_config_file == str(out / "deepspeed.json")
    cmd, env = prepare_deepspeed_cmd_env(a)
    assert cmd is None  # the standard launcher: torchrun on this node, not DeepSpeed's pdsh
    assert (a.nproc_per_node, a.nnodes, a.node_rank) == ("8", "2", 1)
    assert a.rdzv_endpoint == f"127.0.0.1:{opts.main_process_port}"
    # In the training process accelerate builds its DeepSpeed plugin from this environment; with a
    # mixed_precision key in the YAML this raises ("... accelerate config variables will be ignored")
    for key, value in env.items():
        if key.startswith("ACCELERATE_"):
            monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()
    assert plugin.zero_stage == 3 and plugin.gradient_accumulation_steps == 1
    # the trainer's own call (trainer/train.py) under the same environment
    DeepSpeedPlugin(hf_ds_config=build_deepspeed_config(cfg, "cuda"))
    assert plugin.deepspeed_config["train_batch_size"] == 128
    assert plugin.deepspeed_config["bf16"]["enabled"] is True  # accelerate reports bf16 from here


def test_real_accelerate_launch_starts_the_rendered_world(tmp_path):
    # the real `accelerate launch` with cpu-smoke's node config: torchrun starts 2 processes that
    # see the rendered world size, rendezvous address and DeepSpeed config (a probe, not training)
    cfg = preset("cpu-smoke")
    opts = RenderOptions(run_dir=str(tmp_path), main_process_port=free_port())
    write_launch_files(cfg, tmp_path, opts)
    probe = tmp_path / "probe.py"
    probe.write_text(
        textwrap.dedent(
            """
            import json, os, pathlib, sys
            keys = ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_DEEPSPEED_CONFIG_FILE"]
            seen = {k: os.environ.get(k) for k in keys} | {"argv": sys.argv[1:]}
            pathlib.Path(__file__).with_name(f"probe-{os.environ['RANK']}.json").write_text(json.dumps(seen))
            """
        )
    )
    argv = launch_command(cfg, 0, opts)
    assert argv[-4:] == ["-m", "trainer.cli", "--run", str(tmp_path)]
    assert argv[: len(LAUNCHER)] == list(LAUNCHER)
    i = argv.index("trainer.cli") - 2  # keep "--config_file X"; run the probe instead of the trainer
    argv = (
        [sys.executable, *LAUNCHER[1:]]
        + argv[len(LAUNCHER) : i + 1]
        + ["--no_python", sys.executable, str(probe), "--run", "R"]
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # a file per rank: the two ranks share one unbuffered stdout, where their lines can interleave
    probes = [json.loads(f.read_text()) for f in sorted(tmp_path.glob("probe-*.json"))]
    assert sorted(p["RANK"] for p in probes) == ["0", "1"]
    for p in probes:
        assert p["WORLD_SIZE"] == "2" and p["MASTER_ADDR"] == "127.0.0.1"
        assert p["MASTER_PORT"] == str(opts.main_process_port)
        assert p["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == str(tmp_path / "deepspeed.json")
        assert p["argv"] == ["--run", "R"]


def _deepspeed_config(path: Path, world_size: int):
    """DeepSpeed's own config class, as the engine builds it, with a fake world size (it asks
    deepspeed.comm, which has no process group in a test)."""
    import deepspeed.runtime.config as dsc

    with (
        mock.patch.object(dsc.dist, "get_rank", lambda *a, **k: 0),
        mock.patch.object(dsc.dist, "get_world_size", lambda *a, **k: world_size),
    ):
        return dsc.DeepSpeedConfig(str(path))


@pytest.mark.parametrize("name", ALL)
def test_deepspeed_accepts_every_rendered_value(name, tmp_path):
    cfg = preset(name)
    write_launch_files(cfg, tmp_path)
    rendered = json.loads((tmp_path / "deepspeed.json").read_text())
    assert rendered == build_deepspeed_config(cfg)  # the trainer's builder, nothing else
    ds = _deepspeed_config(tmp_path / "deepspeed.json", cfg.topology.world_size)

    checked = set()

    def same(key, value):
        checked.add(key)
        assert value == rendered[key], key

    same("train_batch_size", ds.train_batch_size)
    same("train_micro_batch_size_per_gpu", ds.train_micro_batch_size_per_gpu)
    same("gradient_accumulation_steps", ds.gradient_accumulation_steps)
    same("gradient_clipping", ds.gradient_clipping)
    same("steps_per_print", ds.steps_per_print)
    same("wall_clock_breakdown", ds.wall_clock_breakdown)
    same(
        "bf16",
        {
            "enabled": ds.bfloat16_config.enabled,
            "check_grad_overflow": ds.bfloat16_config.check_grad_overflow,
        },
    )
    fp16 = ds.float16_config
    same(
        "fp16",
        {
            "enabled": fp16.enabled,
            "loss_scale": fp16.loss_scale,
            "initial_scale_power": fp16.initial_scale_power,
            "loss_scale_window": fp16.loss_scale_window,
            "hysteresis": fp16.hysteresis,
            "min_loss_scale": fp16.min_loss_scale,
        },
    )
    zero = ds.zero_config.model_dump(by_alias=True)  # DeepSpeed's names, e.g. stage3_max_live_parameters
    same("zero_optimization", {k: zero[k] for k in rendered["zero_optimization"]})
    if "communication_data_type" in rendered:
        checked.add("communication_data_type")
        assert str(ds.communication_data_type).endswith(
            rendered["communication_data_type"].replace("fp", "float")
        )
    if "data_types" in rendered:  # bf16: gradients accumulate in fp32
        same("data_types", {"grad_accum_dtype": ds.grad_accum_dtype})
        assert ds.grad_accum_dtype == "fp32"
    # a key the builder adds later must be checked here too, not pass unseen
    assert checked == set(rendered)
    # and the values are the preset's
    assert ds.zero_optimization_stage == cfg.deepspeed.zero_stage
    assert zero["reduce_bucket_size"] == cfg.deepspeed.reduce_bucket_size
    assert zero["allgather_bucket_size"] == cfg.deepspeed.allgather_bucket_size
    assert ds.train_batch_size == cfg.effective_batch
    assert ds.bfloat16_config.enabled == (cfg.topology.device == "cuda")


def test_deepspeed_rejects_a_world_size_the_batch_does_not_fit(tmp_path):
    # the fake world size is really used: 16gpu-h100's 128 = 8 x 1 x 16 fails at 8 processes
    cfg = preset("16gpu-h100")
    write_launch_files(cfg, tmp_path)
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        _deepspeed_config(tmp_path / "deepspeed.json", 8)


def test_kubernetes_manifests_parse_and_describe_an_indexed_job(rendered16):
    _cfg, _opts, out = rendered16
    docs = list(yaml.safe_load_all((out / "k8s-job.yaml").read_text()))
    assert [d["kind"] for d in docs] == ["Service", "Job"]
    svc, job = docs
    assert svc["spec"]["clusterIP"] == "None"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 2
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == svc["metadata"]["name"]
    c = pod["containers"][0]
    assert c["command"][:2] == ["taehv-console", "--no-tui"]
    assert c["command"][-1] == str(out / "run.toml")
    env = {e["name"]: e for e in c["env"]}
    assert env["WORLD_SIZE"]["value"] == "2"  # nodes, the PAI-DLC / Kubeflow convention
    assert "job-completion-index" in env["RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert env["MASTER_ADDR"]["value"].startswith(f"{job['metadata']['name']}-0.{svc['metadata']['name']}.")
    assert env["NCCL_DEBUG"]["value"] == "WARN"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    # a selector that matches the pods, or the pod DNS names never resolve
    labels = spec["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in svc["spec"]["selector"].items())


def test_sbatch_is_valid_bash_and_asks_for_the_topology(rendered16):
    _cfg, _, out = rendered16
    text = (out / "sbatch.sh").read_text()
    subprocess.run(["bash", "-n", str(out / "sbatch.sh")], check=True)  # bash's own parser
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=8" in text
    assert "#SBATCH --ntasks-per-node=1" in text and "export NCCL_DEBUG=WARN" in text
    assert os.access(out / "sbatch.sh", os.X_OK)
    # preflight on the allocation, then training; both under the node wrapper, machine rank from SLURM
    preflight, train = text.index("taehv_console.cli preflight"), text.index("-m accelerate.commands.launch")
    assert preflight < text.index("exit 3") < train
    assert text.count("--node-env SLURM_NODEID") == 2 and "accelerate-node-{node}.yaml" in text


def test_cpu_files_say_cpu(tmp_path):
    cfg = preset("cpu-smoke")
    files = render_all(cfg, RenderOptions(run_dir=str(tmp_path)))
    acc = yaml.safe_load(files[accelerate_config_name(0)])
    assert acc["use_cpu"] is True and acc["num_processes"] == 2 and acc["main_process_ip"] == "127.0.0.1"
    assert "export DS_ACCELERATOR=cpu" in files["sbatch.sh"] and "--gpus-per-node" not in files["sbatch.sh"]
    job = list(yaml.safe_load_all(files["k8s-job.yaml"]))[1]
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"] == {}


def test_hostfile_and_hosts(tmp_path):
    cfg = preset("16gpu-h100")
    text = render_hostfile(cfg, RenderOptions(run_dir="/r", hosts=("gpu01", "gpu02")))
    lines = [l for l in text.splitlines() if l and not l.startswith("#")]
    assert lines == ["gpu01 slots=8", "gpu02 slots=8"]
    placeholder = render_hostfile(cfg, RenderOptions(run_dir="/r"))
    assert "node-0 slots=8" in placeholder and "placeholders" in placeholder
    with pytest.raises(ValueError, match="one host per node"):
        render_hostfile(cfg, RenderOptions(run_dir="/r", hosts=("gpu01",)))


def test_run_toml_is_what_the_trainer_loads(rendered16):
    cfg, _, out = rendered16
    assert load_config(out / "run.toml") == cfg
    # and a rendered run.toml is itself a valid preset file (what the Kubernetes pods are given)
    assert load_preset(str(out / "run.toml"), user_dir=None).config == cfg


@pytest.mark.slow
def test_preset_values_reach_the_deepspeed_engine(tmp_path):
    # a real DeepSpeed engine (one CPU process, gloo) built from rendered deepspeed.json files:
    # what the engine reports equals the preset. ZeRO-3 (16gpu-h100) and ZeRO-2 (8gpu-a800),
    # with the topology set to one CPU process so the batch arithmetic holds in a single process;
    # and what derive sizes for 1 x 8 (ZeRO-1, one 2e7 bucket, overlap off) and 2 x 8 (ZeRO-2,
    # 3e6 buckets, overlap on)
    overrides = ["topology.nodes=1", "topology.gpus_per_node=1", "topology.device='cpu'"]
    base = load_preset("8gpu-h100", user_dir=None)
    configs = {
        name: load_preset(name, overrides=overrides, user_dir=None).config
        for name in ("16gpu-h100", "8gpu-a800")
    }
    for nodes in (1, 2):
        derived = derive_run_config(base, nodes, 8).config
        configs[f"derived-{nodes}x8"] = override_config(derived, overrides)
    sized = {
        n: (c.deepspeed.zero_stage, c.deepspeed.reduce_bucket_size, c.deepspeed.overlap_comm)
        for n, c in configs.items()
    }
    assert sized["derived-1x8"] == (1, 20_000_000, False) and sized["derived-2x8"] == (2, 3_000_000, True)
    expected = {}
    for name, cfg in configs.items():
        write_launch_files(cfg, tmp_path / name)
        ds = cfg.deepspeed
        expected[name] = {
            "micro": cfg.optim.batch_per_gpu,
            "accum": cfg.optim.grad_accum,
            "clip": cfg.optim.grad_clip,
            "stage": ds.zero_stage,
            "reduce": ds.reduce_bucket_size,
            "allgather": ds.allgather_bucket_size,
            "overlap": ds.overlap_comm,
            "live": ds.stage3_max_live_parameters if ds.zero_stage == 3 else None,
            "prefetch": ds.stage3_prefetch_bucket_size if ds.zero_stage == 3 else None,
            "persist": ds.stage3_param_persistence_threshold if ds.zero_stage == 3 else None,
        }
    script = textwrap.dedent(
        """
        import json, sys, torch, deepspeed
        from trainer.runtime import skip_deepspeed_shm_op
        skip_deepspeed_shm_op()  # as the trainer's ranks do: no JIT build of DeepSpeed's CPU shm op
        deepspeed.init_distributed(dist_backend="gloo")
        out = {}
        for name in sys.argv[2:]:
            model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=f"{sys.argv[1]}/{name}/deepspeed.json")
            stage = engine.zero_optimization_stage()
            out[name] = {
                "micro": engine.train_micro_batch_size_per_gpu(),
                "accum": engine.gradient_accumulation_steps(),
                "clip": engine.gradient_clipping(),
                "stage": stage,
                "reduce": engine.zero_reduce_bucket_size(),
                "allgather": engine.zero_allgather_bucket_size(),
                "overlap": engine.zero_overlap_comm(),
                "live": engine.zero_max_live_parameters() if stage == 3 else None,
                "prefetch": engine.zero_prefetch_bucket_size() if stage == 3 else None,
                "persist": engine.zero_param_persistence_threshold() if stage == 3 else None,
            }
            # and the ZeRO optimizer itself holds the bucket size (not only the config object);
            # bf16 ZeRO-1 runs as DeepSpeed's BF16_Optimizer, which has no reduce buckets
            out[name]["optimizer"] = type(engine.optimizer).__name__
            out[name]["optimizer_reduce"] = int(getattr(engine.optimizer, "reduce_bucket_size", -1))
        print("ENGINE " + json.dumps(out))
        from trainer.hard_exit import exit_now  # leave as the trainer does: gloo's threads outlive us
        exit_now(0)
        """
    )
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), *expected],
        check=False,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("ENGINE "))
    got = json.loads(line[7:])
    for name, want in expected.items():
        bf16_zero1 = zero1_runs_bf16_optimizer(want["stage"], "bf16")
        assert got[name].pop("optimizer") == (
            "BF16_Optimizer" if bf16_zero1 else "DeepSpeedZeroOptimizer" + "_Stage3" * (want["stage"] == 3)
        ), name
        assert got[name].pop("optimizer_reduce") == (-1 if bf16_zero1 else want["reduce"]), name
        assert got[name] == want, name
    assert zero1_runs_bf16_optimizer(expected["derived-1x8"]["stage"], "bf16")  # the case above was met


@pytest.mark.slow
def test_rendered_files_train_for_real(tmp_path):
    # render cpu-smoke, then run exactly the rendered launch command: 2 CPU ranks train, checkpoint,
    # and the engine's effective DeepSpeed config (written by the trainer) equals what was rendered
    data = tmp_path / "data"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-m", "trainer.cli", "make-synthetic", str(data), "--clips", "6", "--frames", "8"],
        check=True,
        capture_output=True,
        env=env,
        timeout=120,
    )
    overrides = [
        f"data.source={data}",
        "optim.max_steps=2",
        "schedule.checkpoint_every=2",
        "schedule.val_every=2",
    ]
    cfg = load_preset("cpu-smoke", overrides=overrides, user_dir=None).config
    run = tmp_path / "run"
    opts = RenderOptions(run_dir=str(run), main_process_port=free_port())
    write_launch_files(cfg, run, opts)
    argv = launch_command(cfg, 0, opts)
    assert argv[: len(LAUNCHER)] == list(LAUNCHER)
    argv[0] = sys.executable  # what the node wrapper runs "python" as
    env.update(launch_env(cfg))  # what sbatch/k8s export: DS_ACCELERATOR=cpu for a CPU config
    proc = subprocess.run(argv, check=False, capture_output=True, text=True, env=env, timeout=280)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    start = json.loads((run / "events" / "rank-0.jsonl").read_text().splitlines()[0])
    assert start["kind"] == "start" and start["world_size"] == 2 and start["preset"] == "cpu-smoke"
    assert (run / "checkpoints" / "step-2").is_dir()
    rendered = json.loads((run / "deepspeed.json").read_text())
    effective = json.loads((run / "deepspeed.effective.json").read_text())
    for key in (
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "train_batch_size",
        "gradient_clipping",
    ):
        assert effective[key] == rendered[key], key
    for key, value in effective["zero_optimization"].items():
        assert value == rendered["zero_optimization"][key], key
    assert effective["bf16"] == rendered["bf16"]  # enabled, and the overflow check the trainer relies on
