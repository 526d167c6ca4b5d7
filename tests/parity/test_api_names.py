"""Every public name of Ray Train 2.60 (``ray.train.__all__``, ``ray.train.torch.__all__``) imports from trainlib, or
stops the import with what to use instead. No Ray, no workers."""

from __future__ import annotations

import importlib

import pytest

RAY_TRAIN = [
    "BackendConfig",
    "Checkpoint",
    "CheckpointConfig",
    "CheckpointConsistencyMode",
    "CheckpointUploadMode",
    "ControllerError",
    "DataConfig",
    "FailureConfig",
    "LoggingConfig",
    "NCCLHangError",
    "PreemptionError",
    "PreemptionInfo",
    "ReportedCheckpoint",
    "ReportedCheckpointStatus",
    "Result",
    "RunConfig",
    "ScalingConfig",
    "SyncConfig",
    "TRAIN_DATASET_KEY",
    "TrainContext",
    "TrainingFailedError",
    "UserCallback",
    "ValidationConfig",
    "ValidationFn",
    "ValidationTaskConfig",
    "WorkerGroupError",
    "get_all_reported_checkpoints",
    "get_checkpoint",
    "get_context",
    "get_dataset_shard",
    "get_preemption_info",
    "report",
]
RAY_TRAIN_TORCH = [
    "TorchCheckpoint",
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
NOT_BUILT = {
    "BackendConfig": "TorchConfig",
    "LoggingConfig": "'trainlib' logger",
    "NCCLHangError": "timeout_s",
    "PreemptionError": "get_preemption_info",
    "SyncConfig": "storage_path",
    "UserCallback": "trainlib.Callback",
    "ValidationConfig": "report the result with the checkpoint",
    "ValidationFn": "report the result",
    "ValidationTaskConfig": "report the result",
    "TorchCheckpoint": "Checkpoint.from_directory",
}


@pytest.mark.parametrize(
    "module, name", [("trainlib", n) for n in RAY_TRAIN] + [("trainlib.torch", n) for n in RAY_TRAIN_TORCH]
)
def test_each_ray_train_name_imports_or_says_what_to_use_instead(module, name):
    namespace: dict = {}
    statement = f"from {module} import {name}"
    if name not in NOT_BUILT:
        exec(statement, namespace)
        assert namespace[name] is not None
        return
    with pytest.raises(ImportError) as info:
        exec(statement, namespace)
    message = str(info.value)
    assert f"ray.train{module[len('trainlib') :]}.{name}" in message and NOT_BUILT[name] in message, message
    assert "docs/ray_train_parity.md" in message


def test_other_missing_names_are_plain_attribute_errors():
    trainlib = importlib.import_module("trainlib")
    assert not hasattr(trainlib, "no_such_name")
    assert trainlib.TRAIN_DATASET_KEY == "train"
