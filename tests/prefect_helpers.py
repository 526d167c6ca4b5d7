"""A Prefect server for a test module: SQLite in its own PREFECT_HOME, on 127.0.0.1, started and stopped by PID."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from conftest import PREFECT_TEST_SERVER_ENV, free_port
from http_health import healthy

BIN = os.path.dirname(sys.executable)


class PrefectServer:
    """``start()`` returns at once (other set-up can overlap its ~10 s start); ``wait()`` until it answers."""

    def __init__(self, root: Path, base_env: dict[str, str], ui: bool = False):
        self.ui = ui
        self.log_path = root / "prefect.log"
        self.env = dict(
            base_env,
            **PREFECT_TEST_SERVER_ENV,
            PREFECT_HOME=str(root / "prefect_home"),
            PREFECT_UI_ENABLED="true" if ui else "false",
        )
        self._use_port(free_port())
        self.process: subprocess.Popen | None = None

    def _use_port(self, port: int) -> None:
        self.port = port
        self.api_url = f"http://127.0.0.1:{port}/api"
        self.ui_url = f"http://127.0.0.1:{port}"
        if self.ui:
            self.env["PREFECT_UI_API_URL"] = self.api_url

    def start(self) -> PrefectServer:
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [f"{BIN}/prefect", "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        return self

    def wait(self, timeout_s: float = 120, port_retries: int = 2) -> None:
        """Until the server answers. Read ``api_url`` after this: a port that another process bound
        between picking it and the server's bind is replaced by a new one (``port_retries`` times)."""
        deadline = time.monotonic() + timeout_s
        while not healthy(f"{self.api_url}/health"):
            exited = self.process.poll() is not None
            if exited and port_retries > 0 and "already in use" in self.log_path.read_text():
                port_retries -= 1
                self._use_port(free_port())
                self.start()
                continue
            if exited or time.monotonic() > deadline:
                raise RuntimeError(f"the Prefect server did not start; log:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.3)

    def stop(self) -> None:
        if self.process is None:
            return
        # Send this process's queued Prefect logs and events while the server still answers: left queued,
        # Prefect's exit hook retries each against the stopped server, for minutes (seen: 20 min at exit).
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=10)
        EventsWorker.drain_all(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)


def prefect_api(api_url: str, path: str, body: dict | None = None, method: str = "POST"):
    """One call of a Prefect server's REST API (``api_url`` ends in ``/api``): the decoded JSON answer (None for an
    empty one, e.g. an update's 204)."""
    request = urllib.request.Request(
        api_url + path,
        data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = response.read()
        return json.loads(answer) if answer else None


@contextlib.contextmanager
def using_prefect_server(api_url: str):
    """This process's flows and tasks report to the server at ``api_url`` for the block (no ephemeral server)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE: False}):
        yield
