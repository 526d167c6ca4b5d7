"""trainlib: distributed PyTorch training with Ray Train's API, on Ray Core and torch.distributed. Driver and workers.

Example:
    >>> import trainlib
    >>> from trainlib.torch import TorchTrainer
    >>> result = TorchTrainer(train_func, scaling_config=trainlib.ScalingConfig(num_workers=2)).fit()
"""

from trainlib.callbacks import Callback, ReportRecord, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainlib.context import TrainContext, get_checkpoint, get_context, report
from trainlib.errors import (
    ResourcesUnavailableError,
    RunExistsError,
    StorageError,
    TrainingFailedError,
    TrainlibError,
    WorkerError,
)
from trainlib.result import Result

__version__ = "0.1.0"

__all__ = [
    "Callback",
    "Checkpoint",
    "CheckpointConfig",
    "FailureConfig",
    "ReportRecord",
    "ResourcesUnavailableError",
    "Result",
    "RunConfig",
    "RunExistsError",
    "RunInfo",
    "ScalingConfig",
    "StorageError",
    "TrainContext",
    "TrainingFailedError",
    "TrainlibError",
    "WorkerError",
    "get_checkpoint",
    "get_context",
    "report",
]
