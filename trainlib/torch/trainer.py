"""``TorchTrainer``: data-parallel PyTorch training on Ray actors. Constructed and run on the driver."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainlib.checkpoint import Checkpoint
from trainlib.config import RunConfig
from trainlib.data import DataConfig
from trainlib.data_parallel_trainer import DataParallelTrainer
from trainlib.scaling import ScalingConfig
from trainlib.torch._backend import TorchBackend
from trainlib.torch.config import TorchConfig


class TorchTrainer(DataParallelTrainer):
    """Runs ``train_loop_per_worker`` on every worker with torch.distributed set up.

    Each worker is a Ray actor in one placement group; the process group uses
    gloo on CPUs and nccl on GPUs. Inside the function, use
    :func:`prepare_model`, :func:`prepare_data_loader` and ``trainlib.report``.

    Args:
        train_loop_per_worker: ``def train_func()`` or ``def train_func(config)``.
        train_loop_config: the dict passed to ``train_func``.
        scaling_config: workers and their resources.
        run_config: name, storage, checkpoints, failures, callbacks.
        torch_config: process-group backend and timeout.
        resume_from_checkpoint: a checkpoint to start from (``get_checkpoint()``
            returns it) when the run has none of its own.
        datasets: ``{name: ray.data.Dataset}``, read in workers with ``trainlib.get_dataset_shard(name)``.
        dataset_config: how the datasets are split among workers (:class:`trainlib.DataConfig`).
        metadata: a JSON-able dict stored with every checkpoint (``checkpoint.get_metadata()``).

    Example:
        >>> trainer = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2))
        >>> result = trainer.fit()
    """

    def __init__(
        self,
        train_loop_per_worker: Callable,
        *,
        train_loop_config: dict | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        torch_config: TorchConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        metadata: dict[str, Any] | None = None,
    ):
        scaling_config = scaling_config or ScalingConfig()
        torch_config = torch_config or TorchConfig()
        if not isinstance(torch_config, TorchConfig):
            raise TypeError("torch_config must be a trainlib.torch.TorchConfig.")
        if torch_config.backend == "nccl" and not scaling_config.use_gpu:
            raise ValueError("TorchConfig(backend='nccl') needs GPUs: set ScalingConfig(use_gpu=True) or use 'gloo'.")
        super().__init__(
            train_loop_per_worker,
            train_loop_config=train_loop_config,
            scaling_config=scaling_config,
            run_config=run_config,
            resume_from_checkpoint=resume_from_checkpoint,
            backend=TorchBackend(torch_config, scaling_config.use_gpu),
            datasets=datasets,
            dataset_config=dataset_config,
            metadata=metadata,
        )
