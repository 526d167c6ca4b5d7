"""Two drivers, one run name: the second is refused while the first lives, and takes over once it is gone.

Local disk and S3 (moto's server over HTTP). Driver A runs in its own process (its own embedded
Ray); driver B is this test process. B is refused before it starts Ray, with A's host and pid in
the message, and A's run is untouched. After A is SIGKILLed (its record still says RUNNING), B
takes the run over at once (A's pid is gone on this host) and resumes from A's latest commit;
A's committed checkpoints are kept unchanged.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import fsspec
import pytest
from fault_helpers import MotoS3, start_driver
from fault_train_funcs import counting_train_func, expected_w

import trainlib
from trainlib import DataParallelTrainer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

EPOCHS = 10
DRIVER = """
import json, sys
import trainlib
from trainlib import DataParallelTrainer
from fault_train_funcs import counting_train_func
storage_path, options, epochs, sleep_s = {storage_path!r}, {options!r}, {epochs}, {sleep_s}
result = DataParallelTrainer(counting_train_func, train_loop_config={{"epochs": epochs, "sleep_s": sleep_s}},
                             scaling_config=trainlib.ScalingConfig(num_workers=1),
                             run_config=trainlib.RunConfig(name="shared", storage_path=storage_path,
                                                           storage_options=options, verbose=False)).fit()
print("RESULT " + json.dumps(result.metrics_dataframe[["epoch", "attempt", "start_epoch", "w"]].to_dict("list")))
"""


@pytest.fixture(scope="module")
def s3():
    with MotoS3() as server:
        yield server


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """(storage_path, storage_options, fsspec filesystem) on local disk or on the moto S3 server."""
    if request.param == "local":
        return str(tmp_path / "runs"), None, fsspec.filesystem("file")
    s3 = request.getfixturevalue("s3")
    return f"s3://{s3.bucket}/{request.node.name.split('[')[0]}", s3.options(), s3.fs()


def _wait_for(fs, path: str, process, timeout: float = 180.0) -> None:
    inner = fs._strip_protocol(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fs.invalidate_cache()
        if fs.exists(inner):
            return
        if process.poll() is not None:
            raise AssertionError(f"driver A ended before {path} appeared:\n{process.stdout.read()}")
        time.sleep(0.2)
    raise AssertionError(f"{path} did not appear within {timeout}s")


def _fit_b(storage_path, options, epochs=EPOCHS):
    return DataParallelTrainer(
        counting_train_func,
        train_loop_config={"epochs": epochs},
        scaling_config=trainlib.ScalingConfig(num_workers=1),
        run_config=trainlib.RunConfig(name="shared", storage_path=storage_path, storage_options=options, verbose=False),
    ).fit()


def test_second_driver_on_a_live_run_is_refused(where):
    storage_path, options, fs = where
    a = start_driver(DRIVER.format(storage_path=storage_path, options=options, epochs=EPOCHS, sleep_s=0.4))
    try:
        _wait_for(fs, f"{storage_path}/shared/checkpoint_000002/.trainlib_commit.json", a)
        started = time.monotonic()
        with pytest.raises(trainlib.RunExistsError) as info:
            _fit_b(storage_path, options)
        elapsed = time.monotonic() - started
        text = str(info.value)
        assert f"pid {a.pid}" in text and f"host {socket.gethostname()}" in text and "started " in text, text
        assert "RunConfig.name" in text and "wait for it to finish" in text, text
        assert elapsed < 15, elapsed  # refused from storage alone, before any worker starts
        out, _ = a.communicate(timeout=300)
    finally:
        if a.poll() is None:
            os.killpg(a.pid, signal.SIGKILL)
    assert a.returncode == 0, out
    rows = json.loads(out.split("RESULT ", 1)[1])
    # A's run is A's alone: every epoch once, one attempt, never restarted, the exact end value.
    assert rows["epoch"] == list(range(1, EPOCHS + 1)) and set(rows["attempt"]) == {0}
    assert set(rows["start_epoch"]) == {1} and rows["w"][-1] == expected_w(EPOCHS)


def test_dead_drivers_run_is_taken_over_and_resumed(ray_session, where):
    storage_path, options, fs = where
    a = start_driver(DRIVER.format(storage_path=storage_path, options=options, epochs=EPOCHS, sleep_s=0.4))
    try:
        _wait_for(fs, f"{storage_path}/shared/checkpoint_000003/.trainlib_commit.json", a)
    finally:
        os.killpg(a.pid, signal.SIGKILL)  # the driver and the Ray it started
        a.wait()
    run = fs._strip_protocol(f"{storage_path}/shared")
    fs.invalidate_cache()
    assert json.loads(fs.cat_file(f"{run}/trainlib_run.json"))["status"] == "RUNNING"
    # Recognisably stale: readers are told that the driver is gone and how to resume.
    stale = trainlib.Result.from_path(f"{storage_path}/shared", storage_options=options)
    assert stale.error is not None and "is gone" in str(stale.error) and f"pid {a.pid}" in str(stale.error)
    kept = {
        p: fs.cat_file(f"{p}/.trainlib_commit.json")
        for p in fs.glob(f"{run}/checkpoint_*")
        if fs.exists(f"{p}/.trainlib_commit.json")
    }
    assert len(kept) >= 3
    result = _fit_b(storage_path, options)
    df = result.metrics_dataframe
    last_committed = max(int(p.rsplit("_", 1)[1]) for p in kept)
    # Resumed from A's latest commit (not from scratch), with the exact end value.
    assert df["start_epoch"].iloc[-1] == last_committed + 1, df
    assert df["w"].iloc[-1] == expected_w(EPOCHS)
    fs.invalidate_cache()
    for path, marker in kept.items():  # nothing A committed was lost or rewritten
        assert fs.cat_file(f"{path}/.trainlib_commit.json") == marker
    state = json.loads(fs.cat_file(f"{run}/trainlib_run.json"))
    assert state["status"] == "FINISHED"
