"""Small checks preflight runs on a node: a token in the runs directory (is it shared?), a TCP
listener on the master port and connections to it (free? reachable?), the teacher VAE (loads, gives
the student's latent shape), a latent cache (present, complete), and what the data loader costs per
clip on this node's CPUs and videos. Run as
`python -m taehv_console.core.cluster.nodecheck ACTION ...`, each printing one JSON object.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import select
import socket
import sys
import time
from pathlib import Path
from typing import cast

BANNER = b"taehv-preflight\n"
_TOKEN = re.compile(r"[A-Za-z0-9_-]{8,64}")


def token_path(runs_dir: str, token: str) -> Path:
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"bad token {token!r}")
    return Path(runs_dir).expanduser() / f".taehv-preflight-{token}"


def token_write(runs_dir: str, token: str) -> dict:
    path = token_path(runs_dir, token)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(token)
    except OSError as err:
        return {"ok": False, "path": str(path), "error": str(err)}
    return {"ok": True, "path": str(path)}


def token_read(runs_dir: str, token: str) -> dict:
    path = token_path(runs_dir, token)
    try:
        found = path.read_text() == token
    except OSError:
        found = False
    return {"found": found, "path": str(path)}


def token_remove(runs_dir: str, token: str) -> dict:
    try:
        token_path(runs_dir, token).unlink()
        return {"ok": True}
    except OSError as err:
        return {"ok": False, "error": str(err)}


def _any_address_socket() -> tuple[socket.socket, str]:
    """A TCP socket for every address of this node: IPv6 and IPv4 on one (dual-stack, as the
    rendezvous store listens, so a master named by an IPv6 address is checked as it will be
    reached), or IPv4 alone where the kernel has no IPv6."""
    if socket.has_ipv6:
        try:
            s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        except OSError:
            pass
        else:
            try:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            except OSError:
                s.close()
            else:
                return s, "::"
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM), "0.0.0.0"


def port_free(port: int) -> dict:
    s, anywhere = _any_address_socket()
    with s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((anywhere, port))
        except OSError as err:
            return {"free": False, "error": err.strerror or str(err)}
    return {"free": True}


def listen(port: int, seconds: float) -> int:
    """Hold the port, answer each connection with a banner, stop when stdin closes (the console
    went away) or after `seconds`. Prints {"listening": ...} first so the caller knows when."""
    srv, anywhere = _any_address_socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind((anywhere, port))
        srv.listen(64)
    except OSError as err:
        print(json.dumps({"listening": False, "error": err.strerror or str(err)}), flush=True)
        return 1
    print(json.dumps({"listening": True, "port": port}), flush=True)
    deadline = time.monotonic() + seconds
    accepted = 0
    watch = [srv, sys.stdin]
    while time.monotonic() < deadline:
        r, _, _ = select.select(watch, [], [], max(0.0, deadline - time.monotonic()))
        if sys.stdin in r and not cast(io.BufferedReader, sys.stdin.buffer).read1(1):
            break
        if srv in r:
            conn, _ = srv.accept()
            with conn:
                conn.settimeout(2)
                try:
                    conn.sendall(BANNER)
                    conn.recv(1)  # let the client close first: TIME_WAIT stays on its side
                except OSError:
                    pass
            accepted += 1
    srv.close()
    print(json.dumps({"accepted": accepted}), flush=True)
    return 0


def connect(host: str, port: int, timeout: float) -> dict:
    t0 = time.monotonic()
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            got = s.recv(len(BANNER))
    except OSError as err:
        return {
            "ok": False,
            "error": err.strerror or str(err) or type(err).__name__,
            "seconds": round(time.monotonic() - t0, 3),
        }
    if got != BANNER:
        return {
            "ok": False,
            "error": f"something else answers on the port ({got[:32]!r})",
            "seconds": round(time.monotonic() - t0, 3),
        }
    return {"ok": True, "seconds": round(time.monotonic() - t0, 3)}


def teacher(
    path: str,
    subfolder: str,
    channels: int,
    family: str | None = None,
    space_scale: int | None = None,
    time_scale: int | None = None,
) -> dict:
    """Load the teacher and encode a tiny clip on this node (torch and diffusers only here, on demand),
    checking it against the run's family: its class, latent channels and compression (a `custom`
    student's space and time scales)."""
    from trainer.teacher import check_teacher

    return check_teacher(path, subfolder, channels, family, space_scale, time_scale)


def latent_cache(path: str) -> dict:
    """Whether a finished latent cache is at `path` on this node (its manifest is written last)."""
    from trainer.latent_cache import CacheError, read_manifest

    try:
        manifest = read_manifest(Path(path))
    except CacheError as err:
        return {"ok": False, "path": path, "error": str(err)}
    return {
        "ok": True,
        "path": path,
        "clips": len(manifest.get("clips", [])),
        "spec": manifest.get("spec", {}),
    }


def loader(data_config: str, clips: int, scan_budget_s: float = 0.0) -> dict:
    """CPU-s per training clip on this node, measured on its own copy of the data with the run's
    data settings (a JSON DataSection), exactly as the trainer's loader workers prepare clips. With
    a scan budget, the videos are scanned first (scan_videos) and the answer holds it as `scan`:
    one process, so the trainer's imports (torch) are paid once. The measure then samples only
    videos the scan did not find unreadable: the scan's `videos-unreadable` names each bad one once,
    and the loader's `skipped` is left to what the scan could not see (a video that opens and still
    gives no clip). When the scan finds no readable video at all, nothing is measured and the
    answer says `none_readable` (the scan's error is the one finding)."""
    from trainer.bench_data import measure_loader
    from trainer.config import DataSection
    from trainer.data import DataSourceError, find_videos

    scan, unreadable = _scan_videos(data_config, scan_budget_s) if scan_budget_s > 0 else ({}, set())
    with_scan = {"scan": scan} if scan else {}
    try:
        data = DataSection.model_validate_json(data_config)
        videos = find_videos(data.source, data.root)
        sample = [v for v in videos if str(v) not in unreadable]
        if videos and not sample:
            return {
                "ok": False,
                "data_error": True,
                "none_readable": True,
                "error": f"none of the {len(videos)} videos gives a frame",
                **with_scan,
            }
        cost = measure_loader(sample, data, clips)
    except DataSourceError as err:
        return {"ok": False, "data_error": True, "error": str(err), **with_scan}
    except ValueError as err:
        return {"ok": False, "data_error": False, "error": f"bad data settings: {err}", **with_scan}
    return {"ok": True, **cost.to_dict(), **with_scan}


SCAN_NAMED = 5  # unreadable videos named by path; the rest are counted


def first_frame_problem(path: Path) -> str:
    """Why `path` gives no first video frame ("" when it does): empty, not a container PyAV
    opens, no video stream, or nothing decodes. Cheap: one open and one frame, never the whole
    file, so a file damaged further in passes (the trainer skips it then, with a `data` event)."""
    import av  # lazy: only the scan decodes, and a bare node's other checks need no PyAV

    try:
        if path.stat().st_size == 0:
            return "empty file (0 bytes)"
        with av.open(str(path)) as container:
            if not container.streams.video:
                return "no video stream"
            for _frame in container.decode(video=0):
                return ""
            return "no frame decodes"
    except (OSError, av.FFmpegError, ValueError, IndexError) as err:
        why = getattr(err, "strerror", None) or str(err) or type(err).__name__  # strerror: without the path
        return why.splitlines()[0][:200]


def scan_videos(data_config: str, budget_s: float) -> dict:
    """Every video of the data source opened once (first_frame_problem) until `budget_s` seconds
    are spent: how many were scanned and readable, how many unreadable, the first few by path."""
    return _scan_videos(data_config, budget_s)[0]


def _scan_videos(data_config: str, budget_s: float) -> tuple[dict, set[str]]:
    """scan_videos' answer, and every unreadable video's path (the answer names only the first few)."""
    from trainer.config import DataSection
    from trainer.data import DataSourceError, find_videos

    try:
        data = DataSection.model_validate_json(data_config)
        videos = find_videos(data.source, data.root)
    except DataSourceError as err:
        return {"ok": False, "error": str(err)}, set()
    except ValueError as err:
        return {"ok": False, "error": f"bad data settings: {err}"}, set()
    t0 = time.monotonic()
    readable = 0
    unreadable: set[str] = set()
    named: list[dict[str, str]] = []
    for path in videos:
        if time.monotonic() - t0 > budget_s:
            break
        why = first_frame_problem(path)
        if not why:
            readable += 1
            continue
        unreadable.add(str(path))
        if len(named) < SCAN_NAMED:
            named.append({"path": str(path), "why": why})
    answer = {
        "ok": True,
        "videos": len(videos),
        "scanned": readable + len(unreadable),
        "readable": readable,
        "unreadable": len(unreadable),
        "named": named,
        "seconds": round(time.monotonic() - t0, 2),
    }
    return answer, unreadable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m taehv_console.core.cluster.nodecheck")
    sub = parser.add_subparsers(dest="action", required=True)
    for name in ("token-write", "token-read", "token-remove"):
        p = sub.add_parser(name)
        p.add_argument("runs_dir")
        p.add_argument("token")
    p = sub.add_parser("port-free")
    p.add_argument("--port", type=int, required=True)
    p = sub.add_parser("listen")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float, default=30.0)
    p = sub.add_parser("connect")
    p.add_argument("--host", required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--timeout", type=float, default=5.0)
    p = sub.add_parser("teacher")
    p.add_argument("path")
    p.add_argument("--subfolder", default="")
    p.add_argument("--channels", type=int, default=16)
    p.add_argument("--family", default=None, help="the run's model.family (its teacher class and shapes)")
    p.add_argument("--space-scale", type=int, default=None, help="a custom student's 8·p")
    p.add_argument("--time-scale", type=int, default=None, help="a custom student's time scale")
    p = sub.add_parser("latent-cache")
    p.add_argument("path")
    p = sub.add_parser("loader")
    p.add_argument("--data-config", required=True, help="the run's [data] section as JSON")
    p.add_argument("--clips", type=int, default=3)
    p.add_argument("--scan-budget", type=float, default=0.0, help="scan-videos first, for this long")
    p = sub.add_parser("scan-videos")
    p.add_argument("--data-config", required=True, help="the run's [data] section as JSON")
    p.add_argument("--budget", type=float, default=20.0, help="seconds to spend opening videos")
    args = parser.parse_args(argv)
    if args.action == "listen":
        return listen(args.port, args.seconds)
    if args.action == "token-write":
        out = token_write(args.runs_dir, args.token)
    elif args.action == "token-read":
        out = token_read(args.runs_dir, args.token)
    elif args.action == "token-remove":
        out = token_remove(args.runs_dir, args.token)
    elif args.action == "teacher":
        out = teacher(
            args.path, args.subfolder, args.channels, args.family, args.space_scale, args.time_scale
        )
    elif args.action == "latent-cache":
        out = latent_cache(args.path)
    elif args.action == "port-free":
        out = port_free(args.port)
    elif args.action == "loader":
        out = loader(args.data_config, args.clips, args.scan_budget)
    elif args.action == "scan-videos":
        out = scan_videos(args.data_config, args.budget)
    else:
        out = connect(args.host, args.port, args.timeout)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
