"""The run record (trainlib_run.json): one typed record, its status enum, callbacks' state."""

from __future__ import annotations

import json

import fsspec
from ray import cloudpickle

import trainlib
from trainlib._internal.execution.run import TRAINER_FILE, RestoreExtras, SavedTrainer, open_run, start_run
from trainlib._internal.execution.train_fn import TrainFunction
from trainlib._internal.storage.run_record import RUN_STATE_FILE, RunFailure, RunRecord, RunStatus
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.callbacks import RunInfo


def test_the_record_round_trips_through_its_file(tmp_path):
    storage = RunStorage(fsspec.filesystem("file"), str(tmp_path), "run")
    record = RunRecord(
        name="run",
        storage_path=str(tmp_path),
        trainlib_version="0.1.0",
        train_loop_config={"lr": 0.1},
        scaling_config={"num_workers": 2},
        checkpoint_config={"num_to_keep": 1},
        failure_config={"max_failures": 0},
    )
    record.status = RunStatus.FAILED
    record.callbacks["mlflow"] = {"run_id": "abc"}
    record.failures = [RunFailure(rank=1, cause="ValueError: boom")]
    record.save(storage)
    with open(tmp_path / "run" / RUN_STATE_FILE) as f:
        raw = json.load(f)
    assert raw["status"] == "FAILED" and raw["callbacks"] == {"mlflow": {"run_id": "abc"}}
    assert raw["failures"] == [{"rank": 1, "cause": "ValueError: boom"}]
    assert RunRecord.load(storage) == record


def test_an_older_record_with_missing_and_unknown_keys_still_loads():
    record = RunRecord.from_json({"name": "old", "status": "RUNNING", "checkpoint_config": {}, "extra": 1})
    assert record.status is RunStatus.RUNNING and record.callbacks == {} and record.failure_config == {}


class Remembers(trainlib.Callback):
    """Keeps an id across fit() calls of one run through the run record."""

    def __init__(self, new_id):
        self.new_id, self.loaded, self.id = new_id, None, None

    def load_state_dict(self, state):
        self.loaded = state

    def before_run(self, run):
        self.id = (self.loaded or {}).get("id") or self.new_id

    def state_dict(self):
        return {"id": self.id} if self.id else {}


def _open_and_start(tmp_path, callback, if_exists="error"):
    def train_func():
        pass

    run_config = trainlib.RunConfig(name="run", storage_path=str(tmp_path), callbacks=[callback], if_exists=if_exists)
    opened = open_run(
        run_config,
        "run",
        restoring=False,
        train_fn=TrainFunction.bind(train_func, None),
        train_loop_config=None,
        scaling_config=trainlib.ScalingConfig(),
    )
    info = RunInfo(
        name="run",
        path=opened.storage.uri(),
        world_size=1,
        use_gpu=False,
        train_loop_config=None,
        scaling_config={},
        resumed_from=None,
        record=opened.record,
    )
    start_run(opened, info, [callback])
    return opened


def test_a_callbacks_state_is_saved_and_handed_back_on_resume(tmp_path):
    first = Remembers("id-1")
    opened = _open_and_start(tmp_path, first)
    assert first.loaded == {}  # a new run: nothing saved yet
    assert RunRecord.load(opened.storage).callbacks == {"Remembers": {"id": "id-1"}}
    assert RunRecord.load(opened.storage).status is RunStatus.RUNNING
    second = Remembers("id-2")
    _open_and_start(tmp_path, second, if_exists="resume")
    assert second.loaded == {"id": "id-1"} and second.id == "id-1"


def _train(config):
    return config


def test_the_saved_trainer_is_read_back_typed_from_this_and_the_earlier_file_format(tmp_path):
    scaling = trainlib.ScalingConfig(num_workers=3)
    extras = RestoreExtras(
        dataset_config=trainlib.DataConfig(datasets_to_split=["train"]),
        dataset_names=("train", "val"),
        metadata={"team": "a"},
    )
    opened = open_run(
        trainlib.RunConfig(name="run", storage_path=str(tmp_path)),
        "run",
        restoring=False,
        train_fn=TrainFunction.bind(_train, {"lr": 0.5}),
        train_loop_config={"lr": 0.5},
        scaling_config=scaling,
        extras=extras,
    )
    saved = SavedTrainer.load(opened.storage)
    assert saved.train_loop_per_worker({"x": 1}) == {"x": 1} and saved.train_loop_config == {"lr": 0.5}
    assert saved.scaling_config.num_workers == 3
    assert saved.extras.dataset_names == ("train", "val") and saved.extras.metadata == {"team": "a"}
    assert saved.extras.dataset_config._datasets_to_split == ["train"]  # Ray Train keeps it private too
    # A folder written before the function was bound once: the function and config as they were given, no extras.
    opened.storage.write_bytes_atomic(
        opened.storage.join(TRAINER_FILE),
        cloudpickle.dumps(
            {"train_loop_per_worker": _train, "train_loop_config": {"lr": 0.1}, "scaling_config": scaling}
        ),
    )
    earlier = SavedTrainer.load(opened.storage)
    assert earlier.train_loop_per_worker is _train and earlier.train_loop_config == {"lr": 0.1}
    assert earlier.extras == RestoreExtras()
