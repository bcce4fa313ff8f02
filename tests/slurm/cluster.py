"""A real two-node SLURM cluster on loopback for tests: munged (as user munge, its own key, socket
and pid under a private directory), slurmctld, and two slurmd started with `-N n1` / `-N n2` on
127.0.0.2 and 127.0.0.3, all configured through one slurm.conf named by SLURM_CONF. Ports are
picked free, so it does not collide with another cluster or test on the machine.

Needs root (slurmd runs jobs as their user, munged must run as munge) and Debian's slurm-wlm and
munge packages (.ci/run installs them).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

NODES = {"n1": "127.0.0.2", "n2": "127.0.0.3"}
HOSTS_MARK = "# taehv-console tests: the loopback SLURM cluster's node names (tests/slurm/cluster.py)"
BINARIES = (
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "srun",
    "salloc",
    "squeue",
    "scancel",
    "scontrol",
    "sinfo",
)


def missing_binaries() -> list[str]:
    found = {
        b: shutil.which(b)
        or next((p for p in (f"/usr/sbin/{b}", f"/usr/bin/{b}") if os.access(p, os.X_OK)), None)
        for b in BINARIES
    }
    return [b for b, path in found.items() if path is None]


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def ensure_node_names(hosts_file: Path = Path("/etc/hosts")) -> None:
    """n1/n2 must resolve to their slurmd's address: the job's node list names them, and the
    training's rendezvous uses the first one. Added once, under a comment saying who added them."""
    text = hosts_file.read_text()
    wanted = []
    for name, addr in NODES.items():
        try:
            have = socket.gethostbyname(name)
        except OSError:
            have = None
        if have == addr:
            continue
        if have is not None:
            raise RuntimeError(
                f"{name} resolves to {have}, but the test cluster's node {name} is {addr}: fix {hosts_file}"
            )
        wanted.append(f"{addr} {name}")
    if wanted:
        lines = ([HOSTS_MARK] if HOSTS_MARK not in text else []) + wanted
        with open(hosts_file, "a") as f:
            f.write(("" if text.endswith("\n") or not text else "\n") + "\n".join(lines) + "\n")


class LoopbackSlurm:
    """slurmctld + slurmd n1 (127.0.0.2) + slurmd n2 (127.0.0.3), partition `debug` over both with
    OverSubscribe=FORCE (two jobs share a node, as a stop test needs)."""

    def __init__(self, workdir: str | Path | None = None, cpus: int = 2):
        # under /tmp, not pytest's tmp dir: munged runs as user munge, who cannot enter root's 0700
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="taehv-slurm-"))
        self.cpus = cpus
        self.conf = self.dir / "slurm.conf"
        self.munge_dir = self.dir / "munge"
        self.socket = self.munge_dir / "munge.socket"
        self._procs: dict[str, subprocess.Popen] = {}

    # -- environment for clients (sbatch, srun, the console under test)
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        return {**env, **self.env()}

    def run(self, *argv: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
        res = subprocess.run(
            list(argv), capture_output=True, text=True, env=self.client_env(), timeout=timeout, check=False
        )
        if check and res.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {res.returncode}: {res.stderr.strip()[-1000:]}")
        return res

    # -- start
    def start(self, timeout: float = 60) -> LoopbackSlurm:
        ensure_node_names()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)  # munge must reach its own directory inside
        self._start_munge()
        ports = {"ctld": _free_port()}
        for name, addr in NODES.items():
            ports[name] = _free_port(addr)
        self._write_conf(ports)
        self._spawn("slurmctld", [_binary("slurmctld"), "-D", "-c"])
        self._wait(
            lambda: self.run("scontrol", "ping", check=False).returncode == 0, timeout, "slurmctld to answer"
        )
        for name in NODES:
            self._spawn(f"slurmd-{name}", [_binary("slurmd"), "-D", "-c", "-N", name])
        self._wait(self._all_idle, timeout, "both nodes idle in sinfo")
        return self

    def _start_munge(self) -> None:
        munge = pwd.getpwnam("munge")
        # munged wants its socket's directory open to all (clients connect as any user) and its
        # key in a directory only it can read
        private = self.munge_dir / "private"
        for d, mode in ((self.munge_dir, 0o755), (private, 0o700)):
            d.mkdir(exist_ok=True)
            d.chmod(mode)
            os.chown(d, munge.pw_uid, munge.pw_gid)
        key = private / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        os.chown(key, munge.pw_uid, munge.pw_gid)
        d = self.munge_dir
        self._spawn(
            "munged",
            [
                _binary("munged"),
                "-F",
                f"--socket={self.socket}",
                f"--key-file={key}",
                f"--pid-file={d / 'munged.pid'}",
                f"--log-file={d / 'munged.log'}",
                f"--seed-file={private / 'munged.seed'}",
            ],
            user=munge.pw_uid,
            group=munge.pw_gid,
        )
        self._wait(self.socket.exists, 20, "munged's socket")

    def _write_conf(self, ports: dict[str, int]) -> None:
        d = self.dir
        host = socket.gethostname()
        lines = [
            "ClusterName=taehvtest",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ports['ctld']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "MpiDefault=none",
            "SchedulerType=sched/backfill",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "ReturnToService=2",
            "InactiveLimit=0",
            # a stop's SIGTERM grace belongs to the console; this is only SLURM's own cancel path
            "KillWait=30",
            f"StateSaveLocation={d / 'ctld-state'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmctldLogFile={d / 'slurmctld.log'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmdLogFile={d / 'slurmd-%n.log'}",
            f"SlurmdSpoolDir={d / 'spool-%n'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            *(
                f"NodeName={name} NodeHostname={host} NodeAddr={addr} Port={ports[name]} CPUs={self.cpus} "
                "RealMemory=4000 State=UNKNOWN"
                for name, addr in NODES.items()
            ),
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE",
        ]
        (d / "ctld-state").mkdir(exist_ok=True)
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, argv: list[str], **kw) -> None:
        log = open(self.dir / f"{name}.out", "ab")
        self._procs[name] = subprocess.Popen(
            argv,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=self.client_env(),
            start_new_session=True,
            **kw,
        )
        log.close()

    def _wait(self, cond, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            for name, p in self._procs.items():
                if p.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited with {p.returncode} while waiting for {what}: {self.log_tail(name)}"
                    )
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout} s waiting for {what}:\n{self.diagnostics()}")
            time.sleep(0.2)

    def _all_idle(self) -> bool:
        return self.node_states() == {n: "idle" for n in NODES}

    def node_states(self) -> dict[str, str]:
        res = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        out = {}
        for line in res.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                out[parts[0]] = parts[1]
        return out

    def log_tail(self, name: str, chars: int = 2000) -> str:
        for path in (self.dir / f"{name}.log", self.dir / f"{name}.out", self.munge_dir / f"{name}.log"):
            if path.exists() and path.stat().st_size:
                return path.read_text(errors="replace")[-chars:]
        return ""

    def diagnostics(self) -> str:
        return "\n".join(
            f"--- {n}\n{self.log_tail(n)}" for n in ("slurmctld", "slurmd-n1", "slurmd-n2", "munged")
        )

    # -- jobs
    def jobs(self) -> dict[str, str]:
        """job id -> state, for every job the controller still lists as alive."""
        res = self.run("squeue", "-h", "-o", "%i %T", check=False)
        return dict(line.split()[:2] for line in res.stdout.splitlines() if len(line.split()) >= 2)

    def job_field(self, job: str, name: str) -> str | None:
        res = self.run("scontrol", "show", "job", "-o", job, check=False)
        for tok in res.stdout.split():
            key, _, value = tok.partition("=")
            if key == name:
                return value
        return None

    def wait_job_state(self, job: str, states: set[str], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_field(job, "JobState") or ""
            if state in states:
                return state
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job} is {state or 'unknown'}, not {states}, after {timeout} s")
            time.sleep(0.3)

    def cancel_all(self, timeout: float = 60) -> None:
        self.run("scancel", "--full", "--user=" + pwd.getpwuid(os.getuid()).pw_name, check=False)
        deadline = time.monotonic() + timeout
        while self.jobs() and time.monotonic() < deadline:
            time.sleep(0.5)

    # -- stop
    def stop(self) -> None:
        """Cancel every job, `scontrol shutdown` (slurmctld and both slurmd), then munged; any
        daemon of ours still there after that is signalled by its own pid."""
        if "slurmctld" in self._procs:
            self.cancel_all()
            self.run("scontrol", "shutdown", check=False, timeout=30)
        for name in sorted(
            self._procs, key=lambda n: n == "munged"
        ):  # munge last: slurm needs it to shut down
            p = self._procs[name]
            try:
                p.wait(timeout=0.1 if name == "munged" else 20)
            except subprocess.TimeoutExpired:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self._procs.clear()

    def alive(self) -> list[str]:
        return [name for name, p in self._procs.items() if p.poll() is None]
