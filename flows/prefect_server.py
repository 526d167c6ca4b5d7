"""The Prefect server the main command uses: ``PREFECT_API_URL``, one already running, or one it starts.

Runs in the user's shell process (``python -m flows.main``). A server it starts listens on
127.0.0.1 with SQLite in ``<home>/prefect`` and is left running for its UI.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

from tasks.domain.home import PipelineHome

DEFAULT_PREFECT_PORT = 4200
SERVER_START_TIMEOUT_S = 90.0
START_LOCK_FILE = "prefect-start.lock"


@dataclasses.dataclass(frozen=True)
class PrefectServer:
    """The Prefect API to use and how it was found (for the user)."""

    api_url: str
    how: str
    pid: int | None = None  # the server this command started, if it did

    @property
    def ui_url(self) -> str:
        """The UI's base URL (the API URL without ``/api``)."""
        return self.api_url[: -len("/api")] if self.api_url.endswith("/api") else self.api_url


def server_healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    """Whether a Prefect server answers at ``api_url`` (``.../api``)."""
    try:
        with urllib.request.urlopen(api_url.rstrip("/") + "/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def start_prefect_server(prefect_home: str, port: int, log_path: str) -> tuple[str, int]:
    """Start ``prefect server start`` on 127.0.0.1 with SQLite in ``prefect_home``; return (API URL, pid).

    Raises:
        RuntimeError: it did not become healthy in time; the message points at its log.
    """
    os.makedirs(prefect_home, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=prefect_home, PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_UI_ENABLED="true")
    if port != DEFAULT_PREFECT_PORT:  # the UI calls this API, not the default port's
        env["PREFECT_UI_API_URL"] = f"http://127.0.0.1:{port}/api"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    api_url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server_healthy(api_url):
            return api_url, process.pid
        if process.poll() is not None:
            break
        time.sleep(0.5)
    process.terminate()
    raise RuntimeError(
        f"The Prefect server on 127.0.0.1:{port} did not become healthy within "
        f"{SERVER_START_TIMEOUT_S:.0f} s; see {log_path}. Is the port taken? Pass --prefect-port."
    )


def ensure_prefect(home: PipelineHome, port: int) -> PrefectServer:
    """The Prefect API to use: ``PREFECT_API_URL``, a server running on ``port``, or a new one with state in ``home``.

    Raises:
        RuntimeError: ``PREFECT_API_URL`` does not answer, or a new server did not start.
    """
    url = os.environ.get("PREFECT_API_URL")
    if url:
        if not server_healthy(url, timeout_s=5.0):
            raise RuntimeError(
                f"PREFECT_API_URL={url} does not answer ({url.rstrip('/')}/health). Start that "
                "server, or unset PREFECT_API_URL to let this command start one on 127.0.0.1."
            )
        return PrefectServer(url, "from PREFECT_API_URL")
    local = f"http://127.0.0.1:{port}/api"
    if server_healthy(local):
        return PrefectServer(local, f"already running on 127.0.0.1:{port}")
    # One start at a time per home: two commands started together on a fresh home would both migrate its database.
    with start_lock(home):
        if server_healthy(local):  # the command that held the lock started it
            return PrefectServer(local, f"started by another command, running on 127.0.0.1:{port}")
        url, pid = start_prefect_server(home.prefect_home, port, os.path.join(home.root, "prefect-server.log"))
    return PrefectServer(url, f"started (pid {pid}, state in {home.prefect_home}; stop it with `kill {pid}`)", pid)


@contextlib.contextmanager
def start_lock(home: PipelineHome, timeout_s: float | None = None) -> Iterator[None]:
    """Hold ``<home>/prefect-start.lock`` while a server starts; wait for another command that holds it.

    Raises:
        RuntimeError: another command held it for longer than ``timeout_s`` (default: a server's start timeout).
    """
    timeout_s = SERVER_START_TIMEOUT_S + 30.0 if timeout_s is None else timeout_s
    path = os.path.join(home.root, START_LOCK_FILE)
    with open(path, "a+") as lock:
        deadline = time.monotonic() + timeout_s
        told = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"Another command has been starting the Prefect server of {home.root} for more than "
                        f"{timeout_s:.0f} s (it holds {path}). Wait for it and run again, or look at "
                        f"{os.path.join(home.root, 'prefect-server.log')}."
                    ) from None
                if not told:
                    told = True
                    print(f"Another command is starting the Prefect server of {home.root}; waiting for it.", flush=True)
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
