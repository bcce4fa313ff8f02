"""Telling a person what happened to a run: `notify.command` (the event as JSON on its stdin) and
`notify.webhook` (the event POSTed as JSON with a `text` field, which Slack- and Mattermost-style
incoming webhooks accept). Delivery runs on a thread of its own and never holds the run up: each
attempt has a timeout, a failed one is tried a few more times, and a target that keeps failing is
said once, not at every event.
"""

from __future__ import annotations

import functools
import json
import queue
import shlex
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from trainer.config import NotifySection

TRIES = 3
RETRY_S = 1.0  # then 2 s: short, since events queue behind a failing delivery


class Notifier:
    """send(kind, text, **fields) queues an event; a daemon thread delivers it to every target."""

    def __init__(
        self, cfg: NotifySection, run_id: str = "", note: Callable[[str], None] | None = None
    ) -> None:
        self.cfg = cfg
        self.run_id = run_id
        self._note = note or (lambda _m: None)
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self._failed: set[str] = set()  # targets already said to fail
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.cfg.command or self.cfg.webhook)

    def send(self, kind: str, text: str, **fields: object) -> None:
        if not self.enabled:
            return
        event = {"event": kind, "run": self.run_id, "time": time.time(), "text": text, **fields}
        self._queue.put(event)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._deliver_all, daemon=True, name="taehv-notify")
                self._thread.start()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued event was delivered or given up on; False on timeout."""
        deadline = time.time() + timeout_s
        while self._queue.unfinished_tasks and time.time() < deadline:
            time.sleep(0.05)
        return not self._queue.unfinished_tasks

    def _deliver_all(self) -> None:
        while True:
            try:
                event = self._queue.get(timeout=5.0)
            except queue.Empty:
                return
            try:
                if self.cfg.command:
                    self._try("notify.command", functools.partial(self._run_command, event))
                if self.cfg.webhook:
                    self._try("notify.webhook", functools.partial(self._post, event))
            finally:
                self._queue.task_done()

    def _try(self, target: str, deliver: Callable[[], None]) -> None:
        for attempt in range(TRIES):
            try:
                deliver()
            except (OSError, subprocess.SubprocessError, ValueError) as err:
                if attempt + 1 < TRIES:
                    time.sleep(RETRY_S * 2**attempt)
                    continue
                if target not in self._failed:
                    self._failed.add(target)
                    self._note(
                        f"{target} failed ({err}); the run goes on, and later failures are not said again"
                    )
                return
            if target in self._failed:
                self._failed.discard(target)
                self._note(f"{target} delivers again")
            return

    def _run_command(self, event: dict[str, Any]) -> None:
        argv = shlex.split(self.cfg.command)
        res = subprocess.run(
            argv,
            input=json.dumps(event),
            text=True,
            capture_output=True,
            timeout=self.cfg.timeout_s,
            check=False,
        )
        if res.returncode != 0:
            tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or [""]
            raise subprocess.SubprocessError(f"{argv[0]} exited with {res.returncode}: {tail[0][:200]}")

    def _post(self, event: dict[str, Any]) -> None:
        req = urllib.request.Request(
            self.cfg.webhook,
            data=json.dumps(event).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=self.cfg.timeout_s) as resp:
                resp.read(1 << 16)
        except urllib.error.HTTPError as err:
            raise OSError(f"HTTP {err.code} from the webhook") from None
