"""trainlib: distributed PyTorch training with Ray Train's API, on Ray Core and torch.distributed. Driver and workers.

Example:
    >>> import trainlib
    >>> from trainlib.torch import TorchTrainer
    >>> result = TorchTrainer(train_func, scaling_config=trainlib.ScalingConfig(num_workers=2)).fit()
"""

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


def __getattr__(name: str):
    # A Ray Train name that trainlib does not have: an ImportError saying what to use instead.
    from trainlib._internal.not_built import not_built

    raise not_built(__name__, name)
