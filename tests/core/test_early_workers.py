"""With Ray already up, the first attempt's workers start while the callbacks' before_run runs; a before_run
that stops the run leaves no worker nor reservation behind."""

from __future__ import annotations

import time

import pytest
import ray
from error_train_funcs import reporting_train_func

import trainlib
from trainlib import DataParallelTrainer


class _WaitsForTheWorkers(trainlib.Callback):
    """A slow before_run (as MLflow's, 1-3 s): it waits until the workers' CPUs are reserved, at most 10 s."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.saw_workers_reserved = False

    def before_run(self, run):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not self.saw_workers_reserved:
            self.saw_workers_reserved = ray.available_resources().get("CPU", 0) <= ray.cluster_resources()["CPU"] - 2
            time.sleep(0.05)
        if self.fail:
            raise RuntimeError("the tracking server refused the run")


def _trainer(storage_path, callback):
    return DataParallelTrainer(
        reporting_train_func,
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(storage_path=storage_path, callbacks=[callback], verbose=False),
    )


def test_workers_start_during_before_run_and_train(ray_session, storage_path):
    callback = _WaitsForTheWorkers()
    result = _trainer(storage_path, callback).fit()
    assert callback.saw_workers_reserved
    assert result.error is None and "pid" in result.metrics


def test_a_before_run_that_stops_the_run_leaves_nothing_running(ray_session, storage_path):
    callback = _WaitsForTheWorkers(fail=True)
    with pytest.raises(RuntimeError, match="tracking server refused"):
        _trainer(storage_path, callback).fit()
    assert callback.saw_workers_reserved  # they had started
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"]:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) == ray.cluster_resources()["CPU"]
    # The reservation is gone, and with it the actors placed in it.
    assert not [
        pg
        for pg in ray.util.placement_group_table().values()
        if pg["name"].startswith("trainlib-workers") and pg["state"] != "REMOVED"
    ]
