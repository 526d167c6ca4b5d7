"""Tracking and orchestration never sit on the commit path.

A callback that hangs (as an MLflow or Prefect call does when its server accepts and never
answers) delays no commit: checkpoints are committed as soon as every rank reported, and fit()
returns after a bounded wait for the callbacks, saying what was not delivered. The MLflow start-up
probe against a server that never answers fails in seconds, before Ray starts.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest
from fault_helpers import start_driver
from fault_train_funcs import steps_train_func

import trainlib
from trainlib import DataParallelTrainer
from trainlib._internal import tunables

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


class HangingCallback(trainlib.Callback):
    def __init__(self):
        self.calls = 0

    def after_report(self, run, report):
        self.calls += 1
        time.sleep(3600)  # a tracking server that accepted the connection and never answers


def test_a_hanging_callback_delays_no_commit(ray_session, storage_path, monkeypatch, caplog):
    monkeypatch.setattr(tunables, "CALLBACK_DRAIN_TIMEOUT_S", 5.0)
    callback = HangingCallback()
    started = time.monotonic()
    result = DataParallelTrainer(
        steps_train_func,
        train_loop_config={"steps": 4, "sleep_s": 0.2},
        run_config=trainlib.RunConfig(name="hang", storage_path=storage_path, verbose=False, callbacks=[callback]),
    ).fit()
    elapsed = time.monotonic() - started
    assert elapsed < 90, elapsed
    assert callback.calls == 1  # the first call hangs; nothing else waited for it
    rows = result.metrics_dataframe
    assert list(rows["step"]) == [1, 2, 3, 4]
    for step, reported_at in zip(rows["step"], rows["timestamp"]):
        marker = json.load(open(os.path.join(result.path, f"checkpoint_{step:06d}", ".trainlib_commit.json")))
        assert marker["committed_at"] - reported_at < 5, (step, marker["committed_at"] - reported_at)
    assert any("HangingCallback" in r.getMessage() and "not finished" in r.getMessage() for r in caplog.records), (
        caplog.text
    )


@pytest.fixture
def silent_server():
    """A TCP server that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_mlflow_that_never_answers_fails_the_start_in_seconds_before_ray(silent_server, tmp_path):
    driver = start_driver(f"""
        import time, trainlib, ray
        from trainlib.torch import TorchTrainer
        from trainlib.mlflow import MLflowLogger
        started = time.monotonic()
        try:
            TorchTrainer(lambda: None, run_config=trainlib.RunConfig(
                storage_path={str(tmp_path)!r}, callbacks=[MLflowLogger(tracking_uri={silent_server!r})])).fit()
        except trainlib.TrainlibError as exc:
            print("ERROR", type(exc).__name__, exc)
        print("RAY_STARTED", ray.is_initialized())
        print("SECONDS", time.monotonic() - started)
    """)
    out, _ = driver.communicate(timeout=100)
    assert "ERROR TrackingError" in out and silent_server in out and "did not answer" in out, out
    assert "RAY_STARTED False" in out, out
    assert float(out.rsplit("SECONDS", 1)[1]) < 15, out
