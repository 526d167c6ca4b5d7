"""A torn last line in metrics.jsonl (a crash mid-append) is ignored with a warning naming the file."""

from __future__ import annotations

import logging
import os

import pytest
from fault_train_funcs import steps_train_func

import trainlib
from trainlib import DataParallelTrainer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _fit(storage_path, steps, **kw):
    return DataParallelTrainer(
        steps_train_func,
        train_loop_config={"steps": steps},
        run_config=trainlib.RunConfig(name="torn", storage_path=storage_path, verbose=False, **kw),
    ).fit()


def test_torn_last_line_is_ignored_by_readers_and_resume(ray_session, storage_path, caplog):
    first = _fit(storage_path, 3)
    metrics_file = os.path.join(first.path, "metrics.jsonl")
    with open(metrics_file, "a") as f:
        f.write('{"step": 4, "attempt": 0, "time": 1.0, "metr')  # the crash came mid-append
    with caplog.at_level(logging.WARNING, logger="trainlib"):
        again = trainlib.Result.from_path(first.path)
    assert list(again.metrics_dataframe["step"]) == [1, 2, 3]
    assert any("metrics.jsonl" in r.getMessage() and "torn" in r.getMessage() for r in caplog.records), caplog.text
    # A resumed run drops the torn line and appends whole lines after it.
    with open(os.path.join(first.path, "trainlib_run.json")) as f:
        state = f.read()
    with open(os.path.join(first.path, "trainlib_run.json"), "w") as f:
        f.write(state.replace('"FINISHED"', '"FAILED"'))  # as if the driver had crashed at step 4
    resumed = _fit(storage_path, 5)
    assert list(resumed.metrics_dataframe["step"]) == [1, 2, 3, 4, 5]
    lines = open(metrics_file).read().splitlines()
    assert len(lines) == 5 and all(line.endswith("}") for line in lines), lines
    with resumed.checkpoint.as_directory() as folder:  # nothing committed was lost
        assert open(os.path.join(folder, "model.pt")).read() == "rank0 step5"
