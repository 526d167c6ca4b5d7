"""Ray Train's local mode, ScalingConfig(num_workers=0): the function runs in the calling process's main thread,
without Ray, and its reports are committed to the run folder like any run's. No Ray here: fresh processes and
in-process runs only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading

import pytest

import trainlib
from trainlib import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig

# Run in a fresh process: Ray must not start, the function must run in the main thread of this very process, the
# return value is the object itself, and the run folder is a normal one (retention, metrics, Result.from_path).
_SCRIPT = r"""
import json, os, sys, tempfile, threading
import torch
import trainlib
from trainlib.torch import TorchTrainer, get_device, prepare_model

model_box = []

def train_func(config):
    ctx = trainlib.get_context()
    model = prepare_model(torch.nn.Linear(4, 1))
    model_box.append(model)
    for epoch in range(config["epochs"]):
        with tempfile.TemporaryDirectory() as d:
            torch.save(model.state_dict(), os.path.join(d, "model.pt"))
            trainlib.report({"loss": 1.0 / (epoch + 1)}, checkpoint=trainlib.Checkpoint.from_directory(d))
    return {"model": model, "thread": threading.current_thread().name, "pid": os.getpid(),
            "rank": ctx.get_world_rank(), "world": ctx.get_world_size(), "device": str(get_device()),
            "torch_threads": torch.get_num_threads()}

threads_before = torch.get_num_threads()
result = TorchTrainer(train_func, train_loop_config={"epochs": 3},
                      scaling_config=trainlib.ScalingConfig(num_workers=0),
                      run_config=trainlib.RunConfig(name="local", storage_path=sys.argv[1], verbose=False,
                                                    checkpoint_config=trainlib.CheckpointConfig(num_to_keep=2))).fit()
value = result.return_value
import ray
print(json.dumps({
    "same_model": value["model"] is model_box[0], "thread": value["thread"], "pid": value["pid"] == os.getpid(),
    "rank": value["rank"], "world": value["world"], "device": value["device"],
    "threads_kept": value["torch_threads"] == threads_before, "ray_started": ray.is_initialized(),
    "ddp": type(value["model"]).__name__, "path": result.path, "loss": result.metrics["loss"],
    "checkpoint": os.path.basename(result.checkpoint.path), "error": repr(result.error)}))
"""


def test_local_mode_runs_the_function_here_without_ray_and_commits_its_run(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "RAY_ADDRESS": "127.0.0.1:1"},
    )  # joining any Ray would fail loudly
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["same_model"] and seen["thread"] == "MainThread" and seen["pid"], seen  # in this very process
    assert seen["rank"] == 0 and seen["world"] == 1 and seen["device"] == "cpu" and seen["ddp"] == "Linear"
    assert seen["threads_kept"] and not seen["ray_started"], seen
    assert seen["loss"] == pytest.approx(1 / 3) and seen["checkpoint"] == "checkpoint_000003"
    assert seen["error"] == "None"
    # The run folder is a run's: retention kept 2, the metrics log has every report, from_path reads it back.
    assert sorted(p for p in os.listdir(seen["path"]) if p.startswith("checkpoint_")) == [
        "checkpoint_000002",
        "checkpoint_000003",
    ]
    back = trainlib.Result.from_path(seen["path"])
    assert list(back.metrics_dataframe["step"]) == [1, 2, 3] and back.error is None
    assert os.path.exists(os.path.join(back.checkpoint.path, "model.pt"))


def resumable_train_func(config):
    start = trainlib.get_checkpoint()
    first = 0
    if start:
        with start.as_directory() as d:
            with open(os.path.join(d, "state.json")) as f:
                first = json.load(f)["epoch"] + 1
    for epoch in range(first, 4):
        if epoch == config["fail_at"]:
            raise config["error"]
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.json"), "w") as f:
                json.dump({"epoch": epoch}, f)
            trainlib.report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(d))
    return first


@pytest.mark.parametrize("error", [ValueError("boom at 2"), KeyboardInterrupt()])
def test_a_failure_is_raised_as_raised_recorded_and_the_rerun_resumes(tmp_path, error, caplog):
    run_config = RunConfig(
        name="again", storage_path=str(tmp_path), verbose=False, failure_config=trainlib.FailureConfig(max_failures=3)
    )
    trainer = DataParallelTrainer(
        resumable_train_func,
        train_loop_config={"fail_at": 2, "error": error},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=run_config,
    )
    with caplog.at_level("WARNING", logger="trainlib"):
        with pytest.raises(type(error)) as info:
            trainer.fit()
    assert info.value is error  # the function's own exception, not wrapped (Ray Train's local mode)
    assert "max_failures=3) has no effect" in caplog.text  # no restarts in local mode, and it says so
    failed = trainlib.Result.from_path(str(tmp_path / "again"))
    assert isinstance(failed.error, trainlib.TrainingFailedError) and failed.metrics == {"epoch": 1}
    result = DataParallelTrainer(
        resumable_train_func,
        train_loop_config={"fail_at": 99, "error": None},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=run_config,
    ).fit()
    assert result.return_value == 2  # resumed from the checkpoint of epoch 1
    assert list(result.metrics_dataframe["epoch"]) == [0, 1, 2, 3]


def test_a_controller_failure_stops_the_function_at_its_next_report(tmp_path, monkeypatch):
    from trainlib._internal.storage.run_storage import RunStorage

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(RunStorage, "append_metrics_row", full_disk)
    reached = []

    def train_func():
        for step in range(50):
            reached.append(step)
            trainlib.report({"step_metric": step})
            threading.Event().wait(0.05)  # time for the controller to fail on the first commit

    trainer = DataParallelTrainer(
        train_func,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="disk", storage_path=str(tmp_path), verbose=False),
    )
    with pytest.raises(trainlib.ControllerError, match="No space left on device"):
        trainer.fit()
    assert len(reached) < 10, reached  # stopped, not trained to the end with nothing committed


def test_local_mode_under_a_multi_process_torchrun_is_refused_with_the_fix(tmp_path, monkeypatch):
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    trainer = DataParallelTrainer(
        lambda: None,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="torchrun", storage_path=str(tmp_path), verbose=False),
    )
    with pytest.raises(ValueError, match=r"rank 1 of 2.*ScalingConfig\(num_workers=2\)"):
        trainer.fit()
    assert not os.path.exists(tmp_path / "torchrun")  # refused before the run folder was made


def test_a_function_that_cannot_be_pickled_runs_in_local_mode_and_restore_asks_for_it(tmp_path):
    lock = threading.Lock()  # a closure over it cannot be pickled: fine here, nothing is sent (as in Ray Train)

    def train_func():
        with lock:
            trainlib.report({"locked": True})

    with pytest.raises(TypeError, match="cannot be serialised"):  # a worker process would need it pickled
        DataParallelTrainer(train_func, scaling_config=ScalingConfig(num_workers=1))
    run_config = RunConfig(name="closure", storage_path=str(tmp_path), verbose=False)
    result = DataParallelTrainer(train_func, scaling_config=ScalingConfig(num_workers=0), run_config=run_config).fit()
    assert result.metrics == {"locked": True}
    with pytest.raises(ValueError, match=r"cannot be pickled.*restore\(path, train_loop_per_worker=train_func"):
        DataParallelTrainer.restore(result.path)
    again = DataParallelTrainer.restore(result.path, train_loop_per_worker=train_func)
    assert again.scaling_config.local_mode


def locked_train_func(config):
    with config["lock"]:
        trainlib.report({"lr": config["lr"]})


def test_a_config_that_cannot_be_pickled_runs_in_local_mode_and_is_recorded_by_type(tmp_path):
    result = DataParallelTrainer(
        locked_train_func,
        train_loop_config={"lock": threading.Lock(), "lr": 0.1},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="config", storage_path=str(tmp_path), verbose=False),
    ).fit()
    assert result.metrics == {"lr": 0.1}
    with open(os.path.join(result.path, "trainlib_run.json")) as f:
        assert json.load(f)["train_loop_config"] == {"lock": "<lock>", "lr": 0.1}
