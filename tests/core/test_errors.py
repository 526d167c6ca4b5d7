"""Failures surface with the failing rank and its traceback; bad input fails fast and says what to do."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from conftest import pid_running
from error_train_funcs import failing_train_func, label_train_func

import trainlib
import trainlib.torch as trainlib_torch
from trainlib import DataParallelTrainer
from trainlib.torch import TorchTrainer


def _trainer(func, storage_path, config=None, **scaling):
    # DataParallelTrainer: workers without torch (the suite's CPU budget). Their training functions live in
    # error_train_funcs.py: this module imports torch, and the workers would import it with them.
    return DataParallelTrainer(
        func,
        train_loop_config=config,
        scaling_config=trainlib.ScalingConfig(**{"num_workers": 2, **scaling}),
        run_config=trainlib.RunConfig(storage_path=storage_path, verbose=False),
    )


def test_fit_raises_with_the_failing_rank_and_its_traceback_and_stops_the_others(ray_session, storage_path, tmp_path):
    with pytest.raises(trainlib.TrainingFailedError) as info:
        _trainer(failing_train_func, storage_path, {"pid_dir": str(tmp_path), "message": "bad batch 42"}).fit()
    error = info.value
    text = str(error)
    assert "rank 1" in text
    assert "ValueError: bad batch 42" in text
    assert "raise_deep_inside" in text  # the original traceback, not a Ray wrapper's
    assert text.count("Traceback (most recent call last)") == 1
    assert isinstance(error.failures[-1].__cause__, ValueError)
    assert error.failures[-1].rank == 1
    # Every worker process is gone, the sleeping rank 0 included.
    pids = [int((tmp_path / f"rank{r}.pid").read_text()) for r in (0, 1)]
    deadline = time.monotonic() + 10
    while any(pid_running(p) for p in pids):
        assert time.monotonic() < deadline, f"worker processes {pids} still alive"
        time.sleep(0.2)
    # The run is recorded as failed, with what it reported before.
    result = trainlib.Result.from_path(error_path(storage_path))
    assert isinstance(result.error, trainlib.TrainingFailedError) and "bad batch 42" in str(result.error)


def error_path(storage_path):
    (name,) = os.listdir(storage_path)
    return os.path.join(storage_path, name)


def noop_train_func():
    trainlib.report({"x": 1})


@pytest.mark.parametrize(
    "scaling, expected",
    [
        ({"use_gpu": True}, "GPU"),
        ({"resources_per_worker": {"CPU": 64}}, "CPU: 64"),
        ({"num_workers": 40}, "can hold at most"),
        ({"resources_per_worker": {"CPU": 1, "TPU": 1}}, "TPU"),
        ({"use_gpu": False, "accelerator_type": "A100"}, "accelerator_type: A100"),
    ],
)
def test_unsatisfiable_resources_fail_within_seconds(ray_session, storage_path, scaling, expected):
    start = time.monotonic()
    with pytest.raises(trainlib.ResourcesUnavailableError) as info:
        _trainer(noop_train_func, storage_path, **scaling).fit()
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert expected in message and "the cluster has" in message, message
    assert "ScalingConfig" in message or "resources_per_worker" in message
    assert elapsed < 30, f"took {elapsed:.1f}s: an impossible request must not wait for the placement timeout"


def test_resources_held_by_others_time_out_with_what_is_free(ray_session, storage_path):
    import ray

    @ray.remote(num_cpus=3)
    class Hog:
        def ping(self):
            return 1

    hog = Hog.remote()
    ray.get(hog.ping.remote())
    try:
        trainer = DataParallelTrainer(
            noop_train_func,
            scaling_config=trainlib.ScalingConfig(num_workers=2, placement_timeout_s=2),
            run_config=trainlib.RunConfig(storage_path=storage_path, verbose=False),
        )
        with pytest.raises(trainlib.ResourcesUnavailableError, match=r"Timed out after 2s .* free"):
            trainer.fit()
    finally:
        ray.kill(hog)


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: trainlib.ScalingConfig(num_workers=(0, 2)), "num_workers=0 to run the function in this process"),
        (lambda: trainlib.ScalingConfig(num_workers=-3), "num_workers"),
        (lambda: trainlib.ScalingConfig(num_workers="2"), "num_workers"),
        (lambda: trainlib.ScalingConfig(resources_per_worker={"CPU": -1}), "resources_per_worker"),
        (lambda: trainlib.ScalingConfig(resources_per_worker={"GPU": 1}), "use_gpu=True"),
        (lambda: trainlib.ScalingConfig(placement_strategy="ANYWHERE"), "PACK"),
        (lambda: trainlib.CheckpointConfig(num_to_keep=0), "num_to_keep"),
        (lambda: trainlib.CheckpointConfig(checkpoint_score_order="up"), "'max'"),
        (lambda: trainlib.FailureConfig(max_failures=-2), "max_failures"),
        (lambda: trainlib.RunConfig(name="../escape"), "RunConfig.name"),
        (lambda: trainlib.RunConfig(if_exists="replace"), "if_exists"),
    ],
)
def test_bad_configs_name_the_field_and_the_fix(make, field):
    with pytest.raises((ValueError, TypeError)) as info:
        make()
    assert field in str(info.value)


def test_a_storage_path_that_is_a_file_names_the_field_before_any_worker_starts(tmp_path):
    """Fails on the run's first write (the lease), before Ray is touched: no ray_session needed."""
    a_file = tmp_path / "runs"
    a_file.write_text("not a folder")
    trainer = DataParallelTrainer(
        noop_train_func,
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(name="r", storage_path=str(a_file), verbose=False),
    )
    with pytest.raises(trainlib.StorageError, match=r"RunConfig\.storage_path=.*NotADirectoryError.*Pass a folder"):
        trainer.fit()


def takes_nothing():
    pass


def takes_two(a, b):
    pass


def takes_config(config):
    pass


def test_train_func_signature_must_fit_the_config():
    with pytest.raises(TypeError, match="takes no arguments"):
        TorchTrainer(takes_nothing, train_loop_config={"lr": 0.1})
    with pytest.raises(TypeError, match="2 required arguments"):
        TorchTrainer(takes_two)
    TorchTrainer(takes_config)  # no config: it gets {} as Ray Train does
    TorchTrainer(takes_nothing)
    with pytest.raises(TypeError, match="train_loop_config must be a dict"):
        TorchTrainer(takes_config, train_loop_config=[1, 2])


def test_unserialisable_config_names_the_key():
    with pytest.raises(TypeError, match=r"train_loop_config\['lock'\] \(lock\) cannot be serialised"):
        TorchTrainer(takes_config, train_loop_config={"lr": 0.1, "lock": threading.Lock()})


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("no pickling here")


@pytest.mark.parametrize(
    "metrics, expected",
    [
        ([1, 2], "takes a dict, got list"),
        ({"loss": torch.tensor(0.5)}, "call .item()"),
        ({"loss": torch.ones(3)}, "torch tensor"),
        ({1: 0.5}, "metric names must be strings"),
    ],
)
def test_report_rejects_what_ray_train_rejects(metrics, expected):
    # JSON values, tuples and dates are valid metrics (tests/parity/test_reporting.py); tensors and non-str names are not.
    # report() runs these checks in the worker; test_a_tensor_metric_is_refused_as_ray_train_refuses_it
    # shows such a refusal failing fit() end to end, so one worker start covers the path for all of them.
    from trainlib._internal.metrics import clean_metrics

    with pytest.raises(TypeError) as info:
        clean_metrics(metrics)
    assert expected in str(info.value)


def test_report_makes_numpy_values_plain_and_refuses_objects_run_storage_does_not_hold():
    import numpy as np

    from trainlib._internal.metrics import clean_metrics

    clean = clean_metrics(
        {
            "a": np.float32(0.5),
            "b": 3,
            "c": True,
            "d": np.int64(7),
            "e": np.arange(3),
            "f": "text",
            "g": [np.float64(1.5)],
        }
    )
    assert clean == {"a": 0.5, "b": 3, "c": True, "d": 7, "e": [0, 1, 2], "f": "text", "g": [1.5]}
    assert type(clean["a"]) is float and type(clean["g"][0]) is float
    with pytest.raises(TypeError, match=r"metrics\['h'\] is a .*_Unpicklable, which run storage does not hold"):
        clean_metrics({"h": _Unpicklable()})


@pytest.mark.parametrize(
    "call",
    [
        lambda: trainlib.report({"loss": 1.0}),
        lambda: trainlib.get_context(),
        lambda: trainlib.get_checkpoint(),
    ],
)
def test_worker_functions_outside_a_worker_say_where_to_call_them(call):
    with pytest.raises(RuntimeError, match="outside a training worker.*train_loop_per_worker"):
        call()


def test_public_api_is_pinned():
    assert sorted(trainlib.__all__) == sorted(
        [
            "Callback",
            "Checkpoint",
            "CheckpointConfig",
            "CheckpointConsistencyMode",
            "CheckpointUploadMode",
            "ControllerError",
            "DataConfig",
            "DataParallelTrainer",
            "FailureConfig",
            "PreemptionInfo",
            "ReportRecord",
            "ReportedCheckpoint",
            "ReportedCheckpointStatus",
            "ResourcesUnavailableError",
            "Result",
            "RunConfig",
            "RunExistsError",
            "RunInfo",
            "ScalingConfig",
            "StorageError",
            "TRAIN_DATASET_KEY",
            "TrainContext",
            "TrainingFailedError",
            "TrainlibError",
            "WorkerError",
            "WorkerGroupError",
            "get_all_reported_checkpoints",
            "get_checkpoint",
            "get_context",
            "get_dataset_shard",
            "get_preemption_info",
            "report",
        ]
    )
    # Each name is imported when first used (trainlib/__init__.py): every one resolves, to its module's object.
    assert all(getattr(trainlib, n).__module__.startswith("trainlib.") for n in trainlib.__all__ if not n.isupper())
    assert trainlib.TRAIN_DATASET_KEY == "train"
    assert sorted(trainlib_torch.__all__) == [
        "TorchConfig",
        "TorchTrainer",
        "accelerate",
        "backward",
        "enable_reproducibility",
        "get_device",
        "get_devices",
        "prepare_data_loader",
        "prepare_model",
        "prepare_optimizer",
    ]


def test_report_validation_says_trainlib_has_none():
    # Checked before anything else, so it shows on the driver too: no worker needed.
    with pytest.raises(
        ValueError,
        match=r"report\(validation=True\): trainlib has no asynchronous checkpoint "
        r"validation.*Drop validation=",
    ):
        trainlib.report({"loss": 1.0}, validation=True)
    with pytest.raises(RuntimeError):  # the default is accepted: only "outside a worker" remains
        trainlib.report({"loss": 1.0}, validation=False)


def test_label_selector_places_workers_by_node_label_and_a_missing_label_times_out_naming_it(ray_session, storage_path):
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    # Ray labels every node with its id: the selector matches this node, and the workers run there.
    result = _trainer(label_train_func, storage_path, label_selector={"ray.io/node-id": node_id}).fit()
    assert result.metrics["node"] == node_id
    trainer = _trainer(
        label_train_func, storage_path, label_selector=[{"ray.io/node-id": "no-such-node"}] * 2, placement_timeout_s=2
    )
    with pytest.raises(
        trainlib.ResourcesUnavailableError,
        match=r"label_selector=.*no-such-node.*the nodes. labels: \[{.ray.io/node-id.: ",
    ):
        trainer.fit()
    with pytest.raises(ValueError, match="list of 1 selectors for 2 workers"):
        trainlib.ScalingConfig(num_workers=2, label_selector=[{"zone": "a"}])
