"""``DataParallelTrainer``: validates the job, opens the run folder, runs the controller. Driver only.

Framework trainers (``trainlib.torch.TorchTrainer``) subclass it and supply the
worker backend.
"""

from __future__ import annotations

import datetime
import logging
import os
import uuid
from collections.abc import Callable
from typing import Any

from trainlib._internal.execution.fit import run_fit
from trainlib._internal.execution.local_mode import check_not_under_torchrun
from trainlib._internal.execution.run import (
    TRAINER_FILE,
    SavedTrainer,
    run_storage,
)
from trainlib._internal.execution.train_fn import TrainFunction, UnpicklableError
from trainlib._internal.execution.validation import check_metadata
from trainlib._internal.execution.worker import WorkerBackend
from trainlib._internal.storage.lease import RunLease
from trainlib._internal.storage.run_record import RunRecord
from trainlib._internal.storage.run_storage import RunStorage
from trainlib._internal.util.filesystem import resolve_filesystem
from trainlib.callbacks import Callback
from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig, FailureConfig, RunConfig
from trainlib.data import DataConfig, check_datasets
from trainlib.errors import StorageError
from trainlib.result import Result
from trainlib.scaling import ScalingConfig

logger = logging.getLogger("trainlib")


def default_run_name(prefix: str) -> str:
    return f"{prefix}_{datetime.datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}_{uuid.uuid4().hex[:6]}"


class DataParallelTrainer:
    """Runs ``train_loop_per_worker`` on ``scaling_config.num_workers`` Ray actors, with fault tolerance,
    checkpoints and Ray Data shards, but no framework set-up (``TorchTrainer`` adds torch.distributed).

    Args:
        train_loop_per_worker: ``def train_func()`` or ``def train_func(config)``.
        train_loop_config: the dict passed to ``train_func``.
        scaling_config: workers and their resources (``num_workers=(min, max)`` for elastic runs).
        run_config: name, storage, checkpoints, failures, callbacks.
        datasets: ``{name: ray.data.Dataset}``; each worker reads its shard with
            ``trainlib.get_dataset_shard(name)``.
        dataset_config: how the datasets are split (:class:`trainlib.DataConfig`).
        resume_from_checkpoint: a checkpoint to start from when the run has none of its own.
        metadata: a JSON-able dict stored with every checkpoint (``checkpoint.get_metadata()``)
            and given to the workers (``get_context().get_metadata()``).

    Example:
        >>> result = trainlib.DataParallelTrainer(train_func, scaling_config=ScalingConfig(num_workers=4)).fit()
    """

    def __init__(
        self,
        train_loop_per_worker: Callable,
        *,
        train_loop_config: dict | None = None,
        scaling_config: ScalingConfig | None = None,
        run_config: RunConfig | None = None,
        datasets: dict[str, Any] | None = None,
        dataset_config: DataConfig | None = None,
        resume_from_checkpoint: Checkpoint | None = None,
        metadata: dict[str, Any] | None = None,
        backend: WorkerBackend | None = None,
    ):
        # Checked, bound to its config and pickled once, here; shipped to the workers as these bytes. Local mode
        # sends nothing: as in Ray Train, it runs a function that cannot be pickled (restore() then needs it again).
        try:
            self._train_fn: TrainFunction | None = TrainFunction.bind(train_loop_per_worker, train_loop_config)
        except UnpicklableError:
            if not (isinstance(scaling_config, ScalingConfig) and scaling_config.local_mode):
                raise
            self._train_fn = None
        if scaling_config is not None and not isinstance(scaling_config, ScalingConfig):
            raise TypeError("scaling_config must be a trainlib.ScalingConfig, e.g. ScalingConfig(num_workers=2).")
        if run_config is not None and not isinstance(run_config, RunConfig):
            raise TypeError("run_config must be a trainlib.RunConfig.")
        if resume_from_checkpoint is not None and not isinstance(resume_from_checkpoint, Checkpoint):
            raise TypeError("resume_from_checkpoint must be a trainlib.Checkpoint (e.g. result.checkpoint).")
        for callback in run_config.callbacks if run_config else []:
            if not isinstance(callback, Callback):
                raise TypeError(
                    f"RunConfig.callbacks holds {type(callback).__name__}, which is not a trainlib.Callback: "
                    "subclass trainlib.Callback."
                )
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.resume_from_checkpoint = resume_from_checkpoint
        check_datasets(datasets, dataset_config)
        check_metadata(metadata)
        self.backend = backend or WorkerBackend()
        self.datasets = datasets
        self.dataset_config = dataset_config or DataConfig()
        self.metadata = metadata
        self._restoring = False

    # -- public ----------------------------------------------------------------

    def fit(self) -> Result:
        """Run training to the end and return its :class:`Result`.

        Raises:
            TrainingFailedError: a worker failed more often than ``FailureConfig`` allows.
            ResourcesUnavailableError: the cluster cannot hold the workers.
            StorageError: run storage is unusable.
            RunExistsError: the run's folder holds a run that ``RunConfig.if_exists`` forbids reusing,
                or (``RunInUseError``) another driver is training it now.
        """
        rc = self.run_config
        if self.scaling_config.local_mode:
            check_not_under_torchrun()
        if rc.verbose:
            _log_to_console()
        storage = run_storage(rc, rc.name or default_run_name(type(self).__name__))
        # One driver per run: take the run's lease before reading or changing its folder.
        lease = RunLease(storage)
        try:
            lease.acquire()
        except OSError as exc:  # the first write to storage: a file in the way, no permission, a read-only disk
            raise StorageError(
                f"RunConfig.storage_path={rc.storage_path!r}: the run's folder {storage.uri()} cannot be created or "
                f"written ({type(exc).__name__}: {exc}). Pass a folder this process can write to (created if "
                "missing), or an fsspec URL such as 's3://bucket/runs'."
            ) from exc
        try:
            return run_fit(self, storage, lease)
        finally:
            lease.release()

    @classmethod
    def restore(
        cls,
        path: str | os.PathLike,
        *,
        train_loop_per_worker: Callable | None = None,
        train_loop_config: dict | None = None,
        scaling_config: ScalingConfig | None = None,
        datasets: dict[str, Any] | None = None,
        storage_filesystem: Any = None,
        storage_options: dict | None = None,
        callbacks: list[Callback] | None = None,
        worker_runtime_env: dict | None = None,
    ) -> DataParallelTrainer:
        """A trainer that continues the run at ``path`` from its latest committed checkpoint.

        The training function, config, scaling, dataset config and metadata come
        from the run folder unless given here. Datasets and ``worker_runtime_env``
        (it may hold secrets) are not stored: pass them again. Works for unfinished,
        failed and finished runs.
        """
        storage = RunStorage.open_existing(path, storage_filesystem, storage_options, caller=f"{cls.__name__}.restore")
        saved = SavedTrainer.load(storage)
        if saved.train_loop_per_worker is None and train_loop_per_worker is None:
            raise ValueError(
                f"{cls.__name__}.restore({os.fspath(path)!r}): the run ran in local mode with a training "
                "function or config that cannot be pickled, so neither was stored: pass them again, "
                "restore(path, train_loop_per_worker=train_func, train_loop_config={...})."
            )
        record = RunRecord.load(storage)
        run_config = RunConfig(
            name=storage.name,
            storage_path=os.fspath(path).rstrip("/").rsplit("/", 1)[0],
            storage_filesystem=storage_filesystem,
            storage_options=storage_options,
            callbacks=callbacks,
            checkpoint_config=CheckpointConfig(**record.checkpoint_config),
            failure_config=FailureConfig(**record.failure_config),
            if_exists="resume",
            worker_runtime_env=worker_runtime_env,
        )
        missing = sorted(set(saved.extras.dataset_names) - set(datasets or {}))
        if missing:
            raise ValueError(
                f"{cls.__name__}.restore({os.fspath(path)!r}): the run trained on datasets {missing}; "
                "pass them again: restore(path, datasets={...})."
            )
        trainer = cls(
            train_loop_per_worker or saved.train_loop_per_worker,
            train_loop_config=train_loop_config if train_loop_config is not None else saved.train_loop_config,
            scaling_config=scaling_config or saved.scaling_config,
            run_config=run_config,
            datasets=datasets,
            dataset_config=saved.extras.dataset_config,
            metadata=saved.extras.metadata,
        )
        trainer._restoring = True
        return trainer

    @classmethod
    def can_restore(
        cls, path: str | os.PathLike, storage_filesystem: Any = None, storage_options: dict | None = None
    ) -> bool:
        """Whether ``path`` holds a run that :meth:`restore` can continue."""
        fs, inner = resolve_filesystem(path, storage_filesystem, storage_options)
        return fs.exists(inner.rstrip("/") + "/" + TRAINER_FILE)


def _log_to_console() -> None:
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s trainlib %(levelname)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
