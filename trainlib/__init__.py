"""trainlib: distributed PyTorch training with Ray Train's API, on Ray Core and torch.distributed. Driver and workers.

Example:
    >>> import trainlib
    >>> from trainlib.torch import TorchTrainer
    >>> result = TorchTrainer(train_func, scaling_config=trainlib.ScalingConfig(num_workers=2)).fit()
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainlib.callbacks import Callback, ReportRecord, RunInfo
    from trainlib.checkpoint import Checkpoint
    from trainlib.config import CheckpointConfig, FailureConfig, RunConfig
    from trainlib.context import (
        TrainContext,
        get_all_reported_checkpoints,
        get_checkpoint,
        get_context,
        get_dataset_shard,
        get_preemption_info,
        report,
    )
    from trainlib.data import TRAIN_DATASET_KEY, DataConfig
    from trainlib.data_parallel_trainer import DataParallelTrainer
    from trainlib.errors import (
        ControllerError,
        ResourcesUnavailableError,
        RunExistsError,
        StorageError,
        TrainingFailedError,
        TrainlibError,
        WorkerError,
        WorkerGroupError,
    )
    from trainlib.preemption import PreemptionInfo
    from trainlib.reporting import (
        CheckpointConsistencyMode,
        CheckpointUploadMode,
        ReportedCheckpoint,
        ReportedCheckpointStatus,
    )
    from trainlib.result import Result
    from trainlib.scaling import ScalingConfig

__version__ = "0.1.0"

__all__ = [
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


# Each public name's module, imported when the name is first used (PEP 562): ``import trainlib`` (or one of its
# light modules, such as ``trainlib.errors``) does not import torch or Ray until a trainer or context is used.
_MODULES = {
    "Callback": "trainlib.callbacks",
    "ReportRecord": "trainlib.callbacks",
    "RunInfo": "trainlib.callbacks",
    "Checkpoint": "trainlib.checkpoint",
    "CheckpointConfig": "trainlib.config",
    "FailureConfig": "trainlib.config",
    "RunConfig": "trainlib.config",
    "TrainContext": "trainlib.context",
    "get_all_reported_checkpoints": "trainlib.context",
    "get_checkpoint": "trainlib.context",
    "get_context": "trainlib.context",
    "get_dataset_shard": "trainlib.context",
    "get_preemption_info": "trainlib.context",
    "report": "trainlib.context",
    "TRAIN_DATASET_KEY": "trainlib.data",
    "DataConfig": "trainlib.data",
    "DataParallelTrainer": "trainlib.data_parallel_trainer",
    "ControllerError": "trainlib.errors",
    "ResourcesUnavailableError": "trainlib.errors",
    "RunExistsError": "trainlib.errors",
    "StorageError": "trainlib.errors",
    "TrainingFailedError": "trainlib.errors",
    "TrainlibError": "trainlib.errors",
    "WorkerError": "trainlib.errors",
    "WorkerGroupError": "trainlib.errors",
    "PreemptionInfo": "trainlib.preemption",
    "CheckpointConsistencyMode": "trainlib.reporting",
    "CheckpointUploadMode": "trainlib.reporting",
    "ReportedCheckpoint": "trainlib.reporting",
    "ReportedCheckpointStatus": "trainlib.reporting",
    "Result": "trainlib.result",
    "ScalingConfig": "trainlib.scaling",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = getattr(importlib.import_module(_MODULES[name]), name)
        globals()[name] = value
        return value
    # A Ray Train name that trainlib does not have: an ImportError saying what to use instead.
    from trainlib._internal.not_built import not_built

    raise not_built(__name__, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
