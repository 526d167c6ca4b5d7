"""The pipeline's command fails fast on bad input and unreachable services, and stops promptly.

Bad parameters, an unreachable Ray address and an MLflow server that never answers are refused
in seconds with status 2, before a Prefect server is started or any data is fetched. The
command's lifeline stops it within its grace period on SIGINT/SIGTERM even when the clean-up
hangs, and when its Prefect API stops answering.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import REPO_ROOT, free_port
from fault_helpers import start_driver

pytestmark = pytest.mark.timeout(120)


def _cli(tmp_path, *args, timeout=90):
    port = free_port()
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "flows.main", "--home", str(tmp_path / "home"), "--prefect-port", str(port), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": REPO_ROOT, "PREFECT_API_URL": ""},
    )
    with socket.socket() as s:  # no Prefect server was started on the port
        assert s.connect_ex(("127.0.0.1", port)) != 0
    return done, time.monotonic() - started


def test_bad_parameter_is_refused_before_any_server_starts(tmp_path):
    done, seconds = _cli(tmp_path, "--epochs", "0")
    assert done.returncode == 2 and "epochs" in done.stderr, done.stderr
    assert not (tmp_path / "home" / "prefect").exists()
    assert seconds < 60, seconds


def test_unreachable_ray_address_is_refused_in_seconds(tmp_path):
    done, seconds = _cli(tmp_path, "--ray-address", "127.0.0.1:1", "--epochs", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "127.0.0.1:1" in done.stderr and "ray_address" in done.stderr, done.stderr
    assert seconds < 60, seconds


def test_mlflow_that_never_answers_is_refused_before_download(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)  # accepts (the kernel does) and never answers
    url = f"http://127.0.0.1:{server.getsockname()[1]}"
    try:
        done, seconds = _cli(tmp_path, "--mlflow-tracking-uri", url, "--epochs", "1")
    finally:
        server.close()
    assert done.returncode == 2 and "did not answer" in done.stderr and url in done.stderr, done.stderr
    assert not (tmp_path / "home" / "datasets").exists()  # nothing was downloaded
    assert seconds < 60, seconds


HANGING_CLEANUP = """
import time
from flows.lifeline import Lifeline
with Lifeline({api_url!r}, grace_s=3, check_interval_s=0.5, dead_after_s=2):
    try:
        print("READY", flush=True)
        time.sleep(600)  # the flow
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
        time.sleep(600)  # a clean-up that waits on a server that is gone
"""


def _signal_state(pid: int) -> str:
    """The process's state and signal masks (pending, blocked, ignored, caught) from /proc."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "; ".join(
                line.strip()
                for line in f
                if line.startswith(("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt", "Threads"))
            )
    except OSError as exc:
        return f"unreadable ({exc})"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_the_command_within_its_grace_period(signum):
    process = start_driver(HANGING_CLEANUP.format(api_url=None))
    assert process.stdout.readline().strip() == "READY"
    started = time.monotonic()
    process.send_signal(signum)
    try:
        out, _ = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # seen once in a full suite run, not reproduced: say what the child was doing
        status = _signal_state(process.pid)
        process.kill()
        pytest.fail(
            f"the command did not stop within 30 s of {signum.name}; its state: {status}; its output: "
            f"{process.communicate()[0]!r}"
        )
    assert time.monotonic() - started < 3 + 10
    assert process.returncode == 128 + signum, out
    assert "INTERRUPTED" in out and "Stopping the pipeline" in out and "rerun with the same --run-name" in out, out


def test_command_stops_when_its_prefect_api_is_gone():
    process = start_driver(HANGING_CLEANUP.format(api_url=f"http://127.0.0.1:{free_port()}/api"))
    assert process.stdout.readline().strip() == "READY"
    started = time.monotonic()
    out, _ = process.communicate(timeout=40)
    assert time.monotonic() - started < 2 + 3 + 15
    assert "has not answered" in out and "Stopping the pipeline" in out, out
    assert process.returncode == 128 + signal.SIGTERM, out
