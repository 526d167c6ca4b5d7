"""Keeps the pipeline's command answerable: a prompt stop on SIGINT/SIGTERM, and when its Prefect API is gone. CLI only.

Prefect's engine, prefect-ray and Ray each clean up on an interrupt, and each may wait on a
server that no longer answers; so the first SIGINT or SIGTERM interrupts the flow and starts
a grace period (``STOP_GRACE_S``), after which the process exits whatever is still running.
A second signal exits at once. A watcher probes the Prefect API; when it has not answered for
``API_DEAD_AFTER_S`` the command stops the same way, saying so. Training's committed
checkpoints are never at risk: a rerun with the same ``--run-name`` resumes from the latest.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

STOP_GRACE_S = 10.0
API_CHECK_INTERVAL_S = 5.0
API_DEAD_AFTER_S = 30.0


class Lifeline:
    """Use as ``with Lifeline(api_url): run the flow``; installs the handlers and the API watcher."""

    def __init__(
        self,
        api_url: str | None,
        healthy: Callable[[str], bool] | None = None,
        *,
        grace_s: float = STOP_GRACE_S,
        check_interval_s: float = API_CHECK_INTERVAL_S,
        dead_after_s: float = API_DEAD_AFTER_S,
    ):
        from flows.prefect_server import server_healthy

        self.api_url = api_url
        self.healthy = healthy or (lambda url: server_healthy(url, timeout_s=2.0))
        self.grace_s = grace_s
        self.check_interval_s = check_interval_s
        self.dead_after_s = dead_after_s
        self.stopping: str | None = None
        self._done = threading.Event()
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> Lifeline:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._saved[signum] = signal.signal(signum, self._on_signal)
        if self.api_url:
            threading.Thread(target=self._watch_api, name="pipeline-api-watch", daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        for signum, handler in self._saved.items():
            signal.signal(signum, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.stopping:
            print(f"\n{name} again: exiting now.", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.stop(f"{name} received", 128 + signum)
        raise KeyboardInterrupt(self.stopping)

    def stop(self, why: str, status: int) -> None:
        """Start stopping: say why, and exit with ``status`` if the process is still here after the grace period."""
        self.stopping = why
        print(
            f"\nStopping the pipeline ({why}); exiting within {self.grace_s:.0f} s (again to exit now). Committed "
            "checkpoints are kept: rerun with the same --run-name to resume.",
            file=sys.stderr,
            flush=True,
        )

        def force_exit() -> None:
            if not self._done.wait(self.grace_s):
                print(f"Still cleaning up after {self.grace_s:.0f} s ({why}): exiting.", file=sys.stderr, flush=True)
                os._exit(status)

        threading.Thread(target=force_exit, name="pipeline-stop", daemon=True).start()

    def _watch_api(self) -> None:
        last_ok = time.monotonic()
        while not self._done.wait(self.check_interval_s):
            if self.healthy(self.api_url):
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok > self.dead_after_s and not self.stopping:
                print(
                    f"\nThe Prefect API at {self.api_url} has not answered for {self.dead_after_s:.0f} s.",
                    file=sys.stderr,
                    flush=True,
                )
                os.kill(os.getpid(), signal.SIGTERM)  # the main thread stops the flow as on Ctrl-C
                return
