"""Ray Train's report() contract: any picklable metric value, upload modes, custom checkpoint folder names,
get_all_reported_checkpoints, get_context().get_storage(), checkpoint metadata, WorkerGroupError."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

import pytest

import trainlib
from trainlib import CheckpointUploadMode, DataParallelTrainer


def _trainer(func, storage_path, config=None, num_workers=2, name=None, trainer_class=DataParallelTrainer, **kwargs):
    # DataParallelTrainer unless a test needs torch: workers without torch (the suite's CPU budget). The workers
    # import this module to load its training functions: no torch at top level here, TorchTrainer is imported in
    # the two tests that use it.
    run_config = kwargs.pop("run_config", None) or trainlib.RunConfig(
        name=name, storage_path=storage_path, verbose=False
    )
    return trainer_class(
        func,
        train_loop_config=config,
        scaling_config=trainlib.ScalingConfig(num_workers=num_workers),
        run_config=run_config,
        **kwargs,
    )


# -- metric values --------------------------------------------------------------------


def any_value_train_func():
    for step in range(2):
        trainlib.report(
            {
                "loss": 1.0 / (step + 1),
                "phase": f"epoch-{step}",
                "sizes": [3, 1, step],
                "nested": {"lr": 0.1, "groups": ["a", "b"]},
                "note": None,
                "when": datetime.date(2026, 1, step + 1),
                # Names of the dataframe's bookkeeping columns: the user's values must win.
                "step": 10 * step,
                "timestamp": f"t{step}",
            }
        )


def test_any_picklable_metric_value_is_kept_in_metrics_and_the_dataframe(ray_session, storage_path, tmp_path):
    result = _trainer(any_value_train_func, storage_path, name="values").fit()
    assert result.metrics["phase"] == "epoch-1"
    assert result.metrics["sizes"] == [3, 1, 1]
    assert result.metrics["nested"] == {"lr": 0.1, "groups": ["a", "b"]}
    assert result.metrics["note"] is None
    assert result.metrics["when"] == datetime.date(2026, 1, 2)  # the object itself, not its text
    frame = result.metrics_dataframe
    assert list(frame["phase"]) == ["epoch-0", "epoch-1"]
    assert list(frame["loss"]) == [1.0, 0.5]
    assert list(frame["step"]) == [0, 10] and list(frame["timestamp"]) == ["t0", "t1"]
    assert list(frame["attempt"]) == [0, 0]  # bookkeeping that does not collide stays
    # Read back in a fresh process, from storage alone.
    script = (
        "import trainlib, sys; r = trainlib.Result.from_path(sys.argv[1]); "
        "print(repr(r.metrics['when']), r.metrics['sizes'], list(r.metrics_dataframe['phase']), "
        "list(r.metrics_dataframe['step']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, result.path],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert out.returncode == 0, out.stderr
    assert "datetime.date(2026, 1, 2) [3, 1, 1] ['epoch-0', 'epoch-1'] [0, 10]" in out.stdout


def tensor_metric_train_func():
    import torch

    trainlib.report({"loss": torch.tensor(0.5)})


def test_a_tensor_metric_is_refused_as_ray_train_refuses_it(ray_session, storage_path):
    from trainlib.torch import TorchTrainer

    with pytest.raises(trainlib.WorkerGroupError, match=r"call \.item\(\)"):
        _trainer(tensor_metric_train_func, storage_path, num_workers=1, trainer_class=TorchTrainer).fit()


# -- WorkerGroupError / ControllerError -------------------------------------------------


class ShardError(Exception):
    def __init__(self, shard: int):
        super().__init__(f"bad shard {shard}")
        self.shard = shard


def rank1_raises_train_func():
    trainlib.report({"step": 0})
    if trainlib.get_context().get_world_rank() == 1:
        raise ShardError(41)
    time.sleep(600)  # the driver stops this rank


def test_worker_group_error_maps_the_raising_rank_to_its_exception(ray_session, storage_path):
    with pytest.raises(trainlib.WorkerGroupError) as info:
        _trainer(rank1_raises_train_func, storage_path).fit()
    error = info.value
    assert isinstance(error, trainlib.TrainingFailedError)
    assert set(error.worker_failures) == {1}
    assert isinstance(error.worker_failures[1], ShardError) and error.worker_failures[1].shard == 41
    assert "bad shard 41" in str(error)


def test_controller_errors_are_training_failed_errors(ray_session, storage_path):
    with pytest.raises(trainlib.ControllerError) as info:
        DataParallelTrainer(
            any_value_train_func,
            scaling_config=trainlib.ScalingConfig(num_workers=64),
            run_config=trainlib.RunConfig(storage_path=storage_path, verbose=False),
        ).fit()
    assert isinstance(info.value, trainlib.ResourcesUnavailableError)
    assert isinstance(info.value, trainlib.TrainingFailedError)
    assert info.value.controller_failure is info.value


# -- upload modes ------------------------------------------------------------------------


def _user_files(folder: str) -> list[str]:
    return sorted(f for f in os.listdir(folder) if not f.startswith("."))


def _write_checkpoint(folder: str, step: int) -> trainlib.Checkpoint:
    with open(os.path.join(folder, f"rank{trainlib.get_context().get_world_rank()}.json"), "w") as f:
        json.dump({"step": step}, f)
    return trainlib.Checkpoint.from_directory(folder)


def async_train_func(config):
    """The upload waits for a file that the training thread writes only after report() returned:
    a report() that waited for its upload would never return."""
    gate = os.path.join(config["tmp"], f"gate_rank{trainlib.get_context().get_world_rank()}")

    def slow_upload(checkpoint, dir_name):
        deadline = time.monotonic() + 60
        while not os.path.exists(gate):
            assert time.monotonic() < deadline, "report() did not return before the upload"
            time.sleep(0.05)
        storage = trainlib.get_context().get_storage()
        dest = os.path.join(storage.experiment_fs_path, dir_name)
        checkpoint.to_directory(dest)
        return trainlib.Checkpoint(dest, storage.storage_filesystem)

    folder = tempfile.mkdtemp()
    start = time.monotonic()
    trainlib.report(
        {"step": 1},
        checkpoint=_write_checkpoint(folder, 1),
        checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
        checkpoint_upload_fn=slow_upload,
    )
    returned_in = time.monotonic() - start
    open(gate, "w").close()
    folder2 = tempfile.mkdtemp()
    trainlib.report(
        {"step": 2}, checkpoint=_write_checkpoint(folder2, 2), checkpoint_upload_mode=CheckpointUploadMode.ASYNC
    )
    reported = trainlib.get_all_reported_checkpoints()  # waits for both uploads and commits
    trainlib.report(
        {
            "returned_in": returned_in,
            "reported": [r.metrics["step"] for r in reported],
            "folders_left": [os.path.exists(folder), os.path.exists(folder2)],
        }
    )


def test_async_report_returns_before_the_upload_and_deletes_the_folder_after(ray_session, storage_path, tmp_path):
    result = _trainer(async_train_func, storage_path, {"tmp": str(tmp_path)}, name="async").fit()
    assert result.metrics["reported"] == [1, 2]
    assert result.metrics["folders_left"] == [False, False]  # ASYNC deletes the local folder after upload
    with result.checkpoint.as_directory() as folder:
        assert _user_files(folder) == ["rank0.json", "rank1.json"]
        assert json.load(open(os.path.join(folder, "rank1.json"))) == {"step": 2}


def no_upload_train_func():
    storage = trainlib.get_context().get_storage()
    folder = os.path.join(storage.experiment_fs_path, "my_checkpoint_000")  # written in place, by every rank
    os.makedirs(folder, exist_ok=True)
    trainlib.report(
        {"step": 1}, checkpoint=_write_checkpoint(folder, 1), checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD
    )
    outside = tempfile.mkdtemp()
    try:
        trainlib.report(
            {"step": 2}, checkpoint=_write_checkpoint(outside, 2), checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD
        )
    except ValueError as exc:
        trainlib.report({"step": 2, "outside_error": str(exc)})


def test_no_upload_commits_the_folder_in_place_and_keeps_it(ray_session, storage_path):
    result = _trainer(no_upload_train_func, storage_path, name="noupload").fit()
    assert "outside the run's folder" in result.metrics["outside_error"]
    ((checkpoint, metrics),) = result.best_checkpoints
    assert metrics["step"] == 1
    assert checkpoint.path == os.path.join(storage_path, "noupload", "my_checkpoint_000")
    assert _user_files(checkpoint.path) == ["rank0.json", "rank1.json"]


def dir_name_train_func():
    with tempfile.TemporaryDirectory() as folder:
        trainlib.report({"epoch": 3}, checkpoint=_write_checkpoint(folder, 3), checkpoint_dir_name="epoch-3")


def test_checkpoint_dir_name_names_the_folder(ray_session, storage_path):
    result = _trainer(dir_name_train_func, storage_path, name="named").fit()
    assert result.checkpoint.path == os.path.join(storage_path, "named", "epoch-3")
    # A restored run lists it too.
    assert trainlib.Result.from_path(result.path).checkpoint.path.endswith("epoch-3")


# -- get_all_reported_checkpoints across restarts ------------------------------------------


def restarting_train_func(config):
    import torch.distributed

    attempt = trainlib.get_context().get_attempt()
    seen_at_start = [r.metrics["step"] for r in trainlib.get_all_reported_checkpoints()]
    start = 0 if trainlib.get_checkpoint() is None else 2
    for step in range(start, 3):
        with tempfile.TemporaryDirectory() as folder:
            trainlib.report(
                {"step": step, "attempt": attempt, "seen_at_start": seen_at_start},
                checkpoint=_write_checkpoint(folder, step),
            )
        if step == 1 and attempt == 0:
            # Both ranks have reported step 1 before rank 1 fails, however loaded the machine: trainlib keeps
            # the reports every rank made before a failure, not ones a slower rank would have made later.
            torch.distributed.barrier()
            if trainlib.get_context().get_world_rank() == 1:
                raise RuntimeError("planned failure")


def test_get_all_reported_checkpoints_survives_restarts(ray_session, storage_path):
    from trainlib.torch import TorchTrainer  # restarting_train_func holds its ranks together with a gloo barrier

    result = _trainer(
        restarting_train_func,
        storage_path,
        name="restarts",
        trainer_class=TorchTrainer,
        run_config=trainlib.RunConfig(
            name="restarts",
            storage_path=storage_path,
            verbose=False,
            failure_config=trainlib.FailureConfig(max_failures=1),
        ),
    ).fit()
    assert result.metrics["attempt"] == 1
    assert result.metrics["seen_at_start"] == [0, 1]  # the restarted group sees what the first one reported
    assert [m["step"] for _, m in result.best_checkpoints] == [0, 1, 2]


# -- get_storage, metadata -----------------------------------------------------------------


def metadata_train_func():
    storage = trainlib.get_context().get_storage()
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = _write_checkpoint(folder, 1)
        checkpoint.set_metadata({"tokenizer": "bpe"})
        checkpoint.update_metadata({"vocab": 5})
        trainlib.report(
            {
                "experiment_fs_path": storage.experiment_fs_path,
                "dir_name": storage.experiment_dir_name,
                "context_metadata": trainlib.get_context().get_metadata(),
            },
            checkpoint=checkpoint,
        )


def test_checkpoint_metadata_and_trainer_metadata(ray_session, storage_path):
    result = _trainer(metadata_train_func, storage_path, name="meta", metadata={"owner": "team-a"}).fit()
    assert result.metrics["experiment_fs_path"] == os.path.join(storage_path, "meta")
    assert result.metrics["dir_name"] == "meta"
    assert result.metrics["context_metadata"] == {"owner": "team-a"}
    assert result.checkpoint.get_metadata() == {"owner": "team-a", "tokenizer": "bpe", "vocab": 5}
    result.checkpoint.update_metadata({"vocab": 6})
    assert trainlib.Result.from_path(result.path).checkpoint.get_metadata()["vocab"] == 6
    with result.checkpoint.as_directory() as folder:  # metadata is a hidden file beside the user's
        assert _user_files(folder) == ["rank0.json", "rank1.json"]
        assert os.path.exists(os.path.join(folder, ".metadata.json"))


def test_only_numbers_go_to_mlflow_and_the_rest_is_skipped_with_one_warning(
    ray_session, storage_path, tmp_path, caplog
):
    from mlflow.tracking import MlflowClient

    from trainlib.mlflow import MLflowLogger

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow_logger = MLflowLogger(tracking_uri=uri, experiment_name="parity-values")
    with caplog.at_level("WARNING", logger="trainlib"):
        result = _trainer(
            any_value_train_func,
            storage_path,
            name="values-mlflow",
            run_config=trainlib.RunConfig(
                name="values-mlflow", storage_path=storage_path, verbose=False, callbacks=[mlflow_logger]
            ),
        ).fit()
    assert result.metrics["phase"] == "epoch-1"
    run = MlflowClient(uri).get_run(mlflow_logger.run_id)
    assert set(run.data.metrics) == {"loss", "step"}  # the user's own "step" is a number: logged too
    assert [m.value for m in MlflowClient(uri).get_metric_history(run.info.run_id, "loss")] == [1.0, 0.5]
    warnings = [r.message for r in caplog.records if "MLflow logs only numeric metrics" in r.message]
    assert len(warnings) == 1 and "phase" in warnings[0] and "when" in warnings[0]


# -- Result.return_value --------------------------------------------------------------


def return_value_train_func(config):
    trainlib.report({"loss": 0.5})
    if config["unpicklable"]:
        import threading

        return threading.Lock()
    return {"rank": trainlib.get_context().get_world_rank(), "weights": [1.0, 2.0]}


def test_result_return_value_is_what_rank_0_returned(ray_session, storage_path):
    result = _trainer(return_value_train_func, storage_path, config={"unpicklable": False}, name="returns").fit()
    assert result.return_value == {"rank": 0, "weights": [1.0, 2.0]}
    # As in Ray Train, the value lives in fit()'s Result only, not in the run folder.
    assert trainlib.Result.from_path(result.path).return_value is None
    # A value that cannot be pickled does not fail a run that finished: None, and the worker warns.
    result = _trainer(return_value_train_func, storage_path, config={"unpicklable": True}, name="returns-lock").fit()
    assert result.error is None and result.metrics == {"loss": 0.5} and result.return_value is None


def test_an_unpicklable_return_value_is_named_in_the_warning(caplog):
    import threading

    from trainlib._internal.execution.return_value import pickled_return_value as _pickled_return_value

    with caplog.at_level("WARNING", logger="trainlib"):
        assert _pickled_return_value(threading.Lock()) is None
    assert "returned a lock, which cannot be pickled" in caplog.text and "state_dict()" in caplog.text
    assert _pickled_return_value(None) is None and _pickled_return_value(3) is not None


# -- RunConfig.worker_runtime_env -------------------------------------------------------


def runtime_env_train_func():
    import torch

    trainlib.report(
        {
            "probe_seen": os.environ.get("TRAINLIB_PROBE") == "s3cr3t-value",
            "omp": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": torch.get_num_threads(),
        }
    )


def test_worker_runtime_env_reaches_the_workers_its_variables_win_and_it_is_never_stored(ray_session, storage_path):
    from trainlib.torch import TorchTrainer

    env = {"env_vars": {"TRAINLIB_PROBE": "s3cr3t-value", "OMP_NUM_THREADS": "3"}}
    run_config = trainlib.RunConfig(
        name="runtime-env", storage_path=storage_path, verbose=False, worker_runtime_env=env
    )
    assert "s3cr3t" not in repr(run_config)
    result = _trainer(runtime_env_train_func, storage_path, trainer_class=TorchTrainer, run_config=run_config).fit()
    # OMP_NUM_THREADS would be 1 (one CPU per worker) without it: the user's value wins, torch's threads too.
    assert result.metrics == {"probe_seen": True, "omp": "3", "torch_threads": 3}
    for folder, _, files in os.walk(result.path):
        for name in files:
            with open(os.path.join(folder, name), "rb") as f:
                assert b"s3cr3t" not in f.read(), name
    with pytest.raises(TypeError, match="write numbers as strings"):
        trainlib.RunConfig(worker_runtime_env={"env_vars": {"OMP_NUM_THREADS": 3}})
