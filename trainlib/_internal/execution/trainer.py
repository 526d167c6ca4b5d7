"""``DataParallelTrainer``: validates the job, opens the run folder, runs the controller. Driver only.

Framework trainers (``trainlib.torch.TorchTrainer``) subclass it and supply the
worker backend.
"""

from __future__ import annotations

import datetime
import logging
import os
import uuid
from typing import Any, Callable

from trainlib._internal.execution.controller import Controller
from trainlib._internal.execution.embedded_ray import ensure_ray, note_fit_ended
from trainlib._internal.execution.run import (
    TRAINER_FILE,
    close_run,
    load_trainer_file,
    open_run,
    start_run,
)
from trainlib._internal.execution.train_fn import TrainFunction
from trainlib._internal.execution.worker import WorkerBackend
from trainlib._internal.execution.worker_group import RayWorkerGroup
from trainlib._internal.storage.run_record import RunRecord
from trainlib._internal.storage.run_storage import RunStorage
from trainlib._internal.util.filesystem import resolve_filesystem
from trainlib.callbacks import Callback, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainlib.result import Result

logger = logging.getLogger("trainlib")


def default_run_name(prefix: str) -> str:
    return f"{prefix}_{datetime.datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}_{uuid.uuid4().hex[:6]}"


class DataParallelTrainer:
    """Runs ``train_loop_per_worker`` on ``scaling_config.num_workers`` Ray actors."""

    def __init__(self, train_loop_per_worker: Callable, *, train_loop_config: dict | None = None,
                 scaling_config: ScalingConfig | None = None, run_config: RunConfig | None = None,
                 resume_from_checkpoint: Checkpoint | None = None, backend: WorkerBackend | None = None):
        # Checked, bound to its config and pickled once, here; shipped to the workers as these bytes.
        self._train_fn = TrainFunction.bind(train_loop_per_worker, train_loop_config)
        if scaling_config is not None and not isinstance(scaling_config, ScalingConfig):
            raise TypeError("scaling_config must be a trainlib.ScalingConfig, e.g. ScalingConfig(num_workers=2).")
        if run_config is not None and not isinstance(run_config, RunConfig):
            raise TypeError("run_config must be a trainlib.RunConfig.")
        if resume_from_checkpoint is not None and not isinstance(resume_from_checkpoint, Checkpoint):
            raise TypeError("resume_from_checkpoint must be a trainlib.Checkpoint (e.g. result.checkpoint).")
        for callback in (run_config.callbacks if run_config else []):
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
        self.backend = backend or WorkerBackend()
        self._restoring = False

    # -- public ----------------------------------------------------------------

    def fit(self) -> Result:
        """Run training to the end and return its :class:`Result`.

        Raises:
            TrainingFailedError: a worker failed more often than ``FailureConfig`` allows.
            ResourcesUnavailableError: the cluster cannot hold the workers.
            StorageError: run storage is unusable.
            RunExistsError: the run's folder holds a run that ``RunConfig.if_exists`` forbids reusing.
        """
        import ray

        rc = self.run_config
        if rc.verbose:
            _log_to_console()
        ensure_ray()
        run = open_run(rc, rc.name or default_run_name(type(self).__name__), restoring=self._restoring,
                       train_fn=self._train_fn, train_loop_config=self.train_loop_config,
                       scaling_config=self.scaling_config)
        storage = run.storage
        start_from = storage.uri(run.committed[-1].path) if run.committed else (
            self.resume_from_checkpoint.uri if self.resume_from_checkpoint else None)
        run_info = RunInfo(
            name=storage.name, path=storage.uri(), world_size=self.scaling_config.num_workers,
            use_gpu=self.scaling_config.use_gpu, train_loop_config=self.train_loop_config,
            scaling_config=run.record.scaling_config, resumed_from=start_from, record=run.record,
        )
        start_run(run, run_info, rc.callbacks)
        if start_from:
            logger.info("Run %s resumes from %s", storage.name, start_from)
        train_fn_ref = ray.put(self._train_fn)  # once per run: every worker of every attempt reads this copy
        controller = Controller(
            storage=storage, make_worker_group=lambda: RayWorkerGroup(self.scaling_config, self.backend, train_fn_ref),
            checkpoint_config=rc.checkpoint_config, failure_config=rc.failure_config, callbacks=rc.callbacks,
            run_info=run_info, start_checkpoint=self.resume_from_checkpoint, metrics_rows=run.metrics_rows,
            committed=run.committed, verbose=rc.verbose,
        )
        try:
            controller.run()
        except BaseException as exc:
            close_run(run, rc, run_info, controller, exc)
            raise
        finally:
            note_fit_ended()
        return close_run(run, rc, run_info, controller, None)

    @classmethod
    def restore(cls, path: str | os.PathLike, *, train_loop_per_worker: Callable | None = None,
                train_loop_config: dict | None = None, scaling_config: ScalingConfig | None = None,
                storage_filesystem: Any = None, storage_options: dict | None = None,
                callbacks: list[Callback] | None = None) -> "DataParallelTrainer":
        """A trainer that continues the run at ``path`` from its latest committed checkpoint.

        The training function, config and scaling come from the run folder
        unless given here. Works for unfinished, failed and finished runs.
        """
        storage = RunStorage.open_existing(path, storage_filesystem, storage_options,
                                           caller=f"{cls.__name__}.restore")
        saved_func, saved_config, saved_scaling = load_trainer_file(storage)
        record = RunRecord.load(storage)
        run_config = RunConfig(
            name=storage.name, storage_path=os.fspath(path).rstrip("/").rsplit("/", 1)[0],
            storage_filesystem=storage_filesystem, storage_options=storage_options, callbacks=callbacks,
            checkpoint_config=CheckpointConfig(**record.checkpoint_config),
            failure_config=FailureConfig(**record.failure_config), if_exists="resume",
        )
        trainer = cls(
            train_loop_per_worker or saved_func,
            train_loop_config=train_loop_config if train_loop_config is not None else saved_config,
            scaling_config=scaling_config or saved_scaling, run_config=run_config,
        )
        trainer._restoring = True
        return trainer

    @classmethod
    def can_restore(cls, path: str | os.PathLike, storage_filesystem: Any = None,
                    storage_options: dict | None = None) -> bool:
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
