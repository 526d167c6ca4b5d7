"""Reading a run never unpickles: a crafted pickle in run storage is read as a string, never run; metric values
JSON cannot say natively (tuples, int keys, a dict shaped like a tag) come back as they were reported."""

from __future__ import annotations

import base64
import json
import os
import pickle

import pytest
from fault_train_funcs import steps_train_func

import trainlib
from trainlib import DataParallelTrainer
from trainlib.mlflow import MLflowLogger

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

OLD_PICKLE_MARKER = "__trainlib_pickled__"  # how earlier versions stored a value JSON cannot hold


class _RunsAShellCommand:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _crafted_value(marker) -> dict:
    return {OLD_PICKLE_MARKER: base64.b64encode(pickle.dumps(_RunsAShellCommand(str(marker)))).decode("ascii")}


def _plant(run_path: str, value: dict) -> None:
    """Put ``value`` in the last metrics row and in the latest checkpoint's commit marker, as an attacker who can
    write to run storage would."""
    metrics_file = os.path.join(run_path, "metrics.jsonl")
    rows = [json.loads(line) for line in open(metrics_file).read().splitlines()]
    rows[-1]["metrics"]["evil"] = value
    with open(metrics_file, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    marker_file = os.path.join(run_path, rows[-1]["checkpoint"], ".trainlib_commit.json")
    commit = json.load(open(marker_file))
    commit["metrics"]["evil"] = value
    json.dump(commit, open(marker_file, "w"))


def _fit(storage_path, steps, tracking_uri):
    return DataParallelTrainer(
        steps_train_func,
        train_loop_config={"steps": steps},
        run_config=trainlib.RunConfig(
            name="planted",
            storage_path=storage_path,
            verbose=False,
            callbacks=[MLflowLogger(tracking_uri=tracking_uri, experiment_name="planted")],
        ),
    ).fit()


def test_a_pickle_planted_in_run_storage_is_never_executed_by_readers(ray_session, tmp_path):
    storage_path = str(tmp_path / "runs")
    tracking_uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    marker = tmp_path / "code_ran"
    first = _fit(storage_path, 2, tracking_uri)
    _plant(first.path, _crafted_value(marker))

    read = trainlib.Result.from_path(first.path)
    evil = read.metrics["evil"]
    assert isinstance(evil, str) and "posix.system" in evil and "never unpickles" in evil, evil
    assert list(read.metrics_dataframe["evil"])[-1] == evil
    assert read.best_checkpoints[-1][1]["evil"] == evil  # the commit marker's metrics too
    assert not marker.exists()

    # The MLflow logger reads the committed reports back when the run resumes (to fill what MLflow lacks).
    state_file = os.path.join(first.path, "trainlib_run.json")
    state = open(state_file).read()
    with open(state_file, "w") as f:
        f.write(state.replace('"FINISHED"', '"FAILED"'))  # as if the driver had crashed
    resumed = _fit(storage_path, 3, tracking_uri)
    assert list(resumed.metrics_dataframe["step"]) == [1, 2, 3]
    assert not marker.exists()


def shapes_train_func(config):
    trainlib.report(
        {
            "per_class": {0: 0.9, 1: 0.8},
            "lookalike": {OLD_PICKLE_MARKER: "not a pickle", "__trainlib_type__": "tuple"},
            "old_marker_shape": {OLD_PICKLE_MARKER: "abc"},
            "pair": (1, (2, "b")),
        }
    )
    trainlib.report({"confusion": {(0, 1): 3}})


def test_values_json_cannot_say_come_back_as_reported_and_tuple_keys_are_refused_at_report(ray_session, tmp_path):
    storage_path = str(tmp_path / "runs")
    with pytest.raises(trainlib.TrainingFailedError) as info:
        DataParallelTrainer(
            shapes_train_func, run_config=trainlib.RunConfig(name="shapes", storage_path=storage_path, verbose=False)
        ).fit()
    cause = info.value.failures[0].cause  # a worker's error at report(), not the driver's at the end
    assert "metrics['confusion']" in cause and "(0, 1)" in cause and "str, int" in cause, cause
    metrics = trainlib.Result.from_path(f"{storage_path}/shapes").metrics
    assert metrics["per_class"] == {0: 0.9, 1: 0.8}
    assert metrics["lookalike"] == {OLD_PICKLE_MARKER: "not a pickle", "__trainlib_type__": "tuple"}
    assert metrics["old_marker_shape"] == {OLD_PICKLE_MARKER: "abc"}
    assert metrics["pair"] == (1, (2, "b"))
