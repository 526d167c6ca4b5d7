"""Shared pieces of the tracking tests: a real `mlflow server` process and tiny training functions."""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import free_port
from ray import cloudpickle  # trainlib's pickler

# The training functions below run in Ray workers, which cannot import this test folder.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

MLFLOW_BIN = os.path.join(os.path.dirname(sys.executable), "mlflow")
SERVER_START_TIMEOUT_S = 90.0
START_TRIES = 3  # ports tried when another process takes the one picked before the server binds it


class PortTakenError(RuntimeError):
    """Another process holds the port the server was to listen on."""


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 with a SQLite store and proxied artifacts (local, or an S3 URL
    whose credentials and endpoint are in this process's environment)."""

    def __init__(self, root: str, port: int | None = None, artifacts_destination: str | None = None):
        self.root = root
        self.port_given = port is not None  # a restart on the same port (an outage test): never moved
        self.port = port or free_port()
        self.db = os.path.join(root, "mlflow.db")
        self.artifacts = artifacts_destination or os.path.join(root, "mlartifacts")  # a folder or e.g. s3://bucket/x
        self.log_path = os.path.join(root, "server.log")
        self.proc: subprocess.Popen | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MlflowServer:
        """Start the server and wait until it answers; on another free port if another process took this one
        between ``free_port()`` and the server's bind (a Ray process of a parallel test once did)."""
        for _ in range(START_TRIES - 1):
            try:
                return self._start_once()
            except PortTakenError:
                if self.port_given:
                    raise
                self.port = free_port()
        return self._start_once()

    def _start_once(self) -> MlflowServer:
        os.makedirs(self.root, exist_ok=True)
        # One worker and no job runner: start-up in seconds on a 2-core machine.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        env.pop("MLFLOW_TRACKING_URI", None)
        with open(self.log_path, "ab") as log:
            written_before = log.tell()  # the log is appended to: only this start's lines say why it exited
            self.proc = subprocess.Popen(
                [
                    MLFLOW_BIN,
                    "server",
                    "--backend-store-uri",
                    f"sqlite:///{self.db}",
                    "--artifacts-destination",
                    self.artifacts,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--workers",
                    "1",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.root,
                start_new_session=True,
            )
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if "address already in use" in self.log_tail(since=written_before).lower():
                    raise PortTakenError(f"port {self.port} taken:\n{self.log_tail()}")
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except http.client.HTTPException as exc:  # not HTTP: another process's server holds the port
                self.stop()
                raise PortTakenError(f"port {self.port} answers as another server ({exc!r})") from None
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"mlflow server did not answer /health in {SERVER_START_TIMEOUT_S} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """Kill the server and its worker processes (its own process group) and wait until the port is free."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) != 0:
                    return
            time.sleep(0.1)

    def log_tail(self, n: int = 3000, since: int = 0) -> str:
        """The last ``n`` characters of the server's log, from byte ``since`` on."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(since)
                return f.read().decode(errors="replace")[-n:]
        except OSError:
            return ""


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    server = MlflowServer(str(tmp_path_factory.mktemp("mlflow_server"))).start()
    yield server
    server.stop()


def have_chromium() -> str | None:
    return shutil.which("chromium") or (os.path.exists("/usr/bin/chromium") and "/usr/bin/chromium") or None


# -- training functions (run in Ray workers) ---------------------------------------------------


def train_linear(config):
    """A few steps of linear regression with DDP; every step reports metrics and a checkpoint."""
    import tempfile

    import torch

    import trainlib
    from trainlib.torch import prepare_model

    ctx = trainlib.get_context()
    if config.get("marker"):
        with open(config["marker"], "a") as f:  # proves that a worker started
            f.write(f"{ctx.get_world_rank()}\n")
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.1))
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    start = 1
    checkpoint = trainlib.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            saved = torch.load(os.path.join(folder, "model.pt"), weights_only=True)
            model.load_state_dict(saved)
            with open(os.path.join(folder, "step.txt")) as f:
                start = int(f.read()) + 1
    for step in range(start, config["steps"] + 1):
        if config.get("fail_always_at") == step:
            raise RuntimeError(f"injected failure at step {step} on rank {ctx.get_world_rank()}")
        if config.get("fail_once_at") == step and ctx.get_attempt() == 0 and ctx.get_world_rank() == 1:
            raise RuntimeError(f"injected one-time failure at step {step}")
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        metrics = {"loss": loss.item(), "step_seen": step}
        with tempfile.TemporaryDirectory() as folder:
            if ctx.get_world_rank() == 0:
                torch.save(model.state_dict(), os.path.join(folder, "model.pt"))
                with open(os.path.join(folder, "step.txt"), "w") as f:
                    f.write(str(step))
                trainlib.report(metrics, checkpoint=trainlib.Checkpoint.from_directory(folder))
            else:
                trainlib.report(metrics)
