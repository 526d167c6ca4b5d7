"""``DataParallelTrainer``: validates the job, prepares the run folder, runs the controller. Driver only.

Framework trainers (``trainlib.torch.TorchTrainer``) subclass it and supply the
worker backend.
"""

from __future__ import annotations

import datetime
import inspect
import logging
import os
import time
import uuid
from typing import Any, Callable

import cloudpickle

from trainlib._internal.execution.controller import Controller
from trainlib._internal.execution.embedded_ray import ensure_ray, note_fit_ended
from trainlib._internal.execution.worker import WorkerBackend
from trainlib._internal.execution.worker_group import RayWorkerGroup
from trainlib._internal.storage.run_record import RUN_STATE_FILE
from trainlib._internal.storage.run_storage import RunStorage
from trainlib._internal.util.filesystem import declares_shared, resolve_filesystem
from trainlib.callbacks import Callback, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from trainlib.errors import RunExistsError, TrainingFailedError
from trainlib.result import Result

logger = logging.getLogger("trainlib")

TRAINER_FILE = "trainer.pkl"


def _version() -> str:
    from trainlib import __version__

    return __version__


def _check_train_func(func: Callable, config: dict | None) -> bool:
    """Validate the training function against the config; return whether it takes the config."""
    if not callable(func):
        raise TypeError(f"train_loop_per_worker must be a function, got {type(func).__name__}.")
    params = list(inspect.signature(func).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    takes_varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    name = getattr(func, "__name__", "train_loop_per_worker")
    if len(required) > 1:
        raise TypeError(
            f"train_loop_per_worker {name}{inspect.signature(func)} has {len(required)} required arguments; it "
            "may take at most one, the config dict: def train_func(config): ..."
        )
    if config is not None and not positional and not takes_varargs:
        raise TypeError(
            f"train_loop_config was given but train_loop_per_worker {name}() takes no arguments: define it "
            "as def train_func(config): ... to receive the config, or drop train_loop_config."
        )
    return bool(positional) or takes_varargs


def _check_picklable(what: str, value: Any) -> None:
    try:
        cloudpickle.dumps(value)
        return
    except Exception as exc:  # noqa: BLE001 - narrowed to the culprit below
        error = exc
    if isinstance(value, dict):
        for key, item in value.items():
            try:
                cloudpickle.dumps(item)
            except Exception as exc:  # noqa: BLE001
                raise TypeError(
                    f"{what}[{key!r}] ({type(item).__name__}) cannot be serialised to send to the workers: "
                    f"{exc}. Pass plain values (numbers, strings, lists, dicts) and build objects such as "
                    "models, data loaders or locks inside train_loop_per_worker."
                ) from None
    raise TypeError(
        f"{what} cannot be serialised to send to the workers: {error}. Make it a plain module-level "
        "function and build unpicklable objects (locks, open files, clients) inside it."
    ) from None


def default_run_name(prefix: str) -> str:
    return f"{prefix}_{datetime.datetime.now().strftime('%Y-%m-%d_%H-%M-%S')}_{uuid.uuid4().hex[:6]}"


class DataParallelTrainer:
    """Runs ``train_loop_per_worker`` on ``scaling_config.num_workers`` Ray actors."""

    def __init__(self, train_loop_per_worker: Callable, *, train_loop_config: dict | None = None,
                 scaling_config: ScalingConfig | None = None, run_config: RunConfig | None = None,
                 resume_from_checkpoint: Checkpoint | None = None, backend: WorkerBackend | None = None):
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            raise TypeError(
                f"train_loop_config must be a dict, got {type(train_loop_config).__name__}: "
                "e.g. train_loop_config={'lr': 1e-3, 'epochs': 10}."
            )
        takes_config = _check_train_func(train_loop_per_worker, train_loop_config)
        if scaling_config is not None and not isinstance(scaling_config, ScalingConfig):
            raise TypeError("scaling_config must be a trainlib.ScalingConfig, e.g. ScalingConfig(num_workers=2).")
        if run_config is not None and not isinstance(run_config, RunConfig):
            raise TypeError("run_config must be a trainlib.RunConfig.")
        if resume_from_checkpoint is not None and not isinstance(resume_from_checkpoint, Checkpoint):
            raise TypeError("resume_from_checkpoint must be a trainlib.Checkpoint (e.g. result.checkpoint).")
        _check_picklable("train_loop_config", train_loop_config)
        _check_picklable("train_loop_per_worker", train_loop_per_worker)
        for callback in (run_config.callbacks if run_config else []):
            if not isinstance(callback, Callback):
                raise TypeError(
                    f"RunConfig.callbacks holds {type(callback).__name__}, which is not a trainlib.Callback: "
                    "subclass trainlib.Callback."
                )
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self._call_config = train_loop_config if train_loop_config is not None else ({} if takes_config else None)
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
        rc = self.run_config
        if rc.verbose:
            _log_to_console()
        ensure_ray()
        storage, state, committed, rows = self._prepare_run()
        start_from = storage.uri(committed[-1].path) if committed else (
            self.resume_from_checkpoint.uri if self.resume_from_checkpoint else None)
        run_info = RunInfo(
            name=storage.name, path=storage.uri(), world_size=self.scaling_config.num_workers,
            use_gpu=self.scaling_config.use_gpu, train_loop_config=self.train_loop_config,
            scaling_config=_public_fields(self.scaling_config), resumed_from=start_from, state=state,
        )
        for callback in rc.callbacks:
            callback.before_run(run_info)  # may raise: nothing has started yet
        state["status"] = "RUNNING"
        storage.write_json_atomic(storage.join(RUN_STATE_FILE), state)
        if start_from:
            logger.info("Run %s resumes from %s", storage.name, start_from)
        controller = Controller(
            train_func=self.train_loop_per_worker, train_loop_config=self._call_config, storage=storage,
            make_worker_group=lambda: RayWorkerGroup(self.scaling_config, self.backend),
            checkpoint_config=rc.checkpoint_config, failure_config=rc.failure_config, callbacks=rc.callbacks,
            run_info=run_info, start_checkpoint=self.resume_from_checkpoint, metrics_rows=rows,
            committed=committed, verbose=rc.verbose,
        )
        try:
            controller.run()
        except BaseException as exc:
            self._end_run(storage, state, controller, exc)
            raise
        finally:
            note_fit_ended()
        return self._end_run(storage, state, controller, None)

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
        name = storage.name
        saved = cloudpickle.loads(storage.fs.cat_file(storage.join(TRAINER_FILE)))
        state = storage.read_run_state()
        run_config = RunConfig(
            name=name, storage_path=os.fspath(path).rstrip("/").rsplit("/", 1)[0], storage_filesystem=storage_filesystem,
            storage_options=storage_options, callbacks=callbacks,
            checkpoint_config=CheckpointConfig(**state.get("checkpoint_config", {})),
            failure_config=FailureConfig(**state.get("failure_config", {})), if_exists="resume",
        )
        trainer = cls(
            train_loop_per_worker or saved["train_loop_per_worker"],
            train_loop_config=train_loop_config if train_loop_config is not None else saved["train_loop_config"],
            scaling_config=scaling_config or saved["scaling_config"], run_config=run_config,
        )
        trainer._restoring = True
        return trainer

    @classmethod
    def can_restore(cls, path: str | os.PathLike, storage_filesystem: Any = None,
                    storage_options: dict | None = None) -> bool:
        """Whether ``path`` holds a run that :meth:`restore` can continue."""
        fs, inner = resolve_filesystem(path, storage_filesystem, storage_options)
        return fs.exists(inner.rstrip("/") + "/" + TRAINER_FILE)

    # -- internals ---------------------------------------------------------------

    def _prepare_run(self) -> tuple[RunStorage, dict[str, Any], list, list]:
        rc = self.run_config
        fs, root = resolve_filesystem(rc.storage_path, rc.storage_filesystem, rc.storage_options)
        name = rc.name or default_run_name(type(self).__name__)
        storage = RunStorage(fs, root, name, shared=declares_shared(rc.storage_path))
        committed, rows = [], []
        if storage.exists():
            previous = storage.read_run_state()
            status = previous.get("status")
            if rc.if_exists == "error" or (status == "FINISHED" and not self._restoring and rc.if_exists != "overwrite"):
                raise RunExistsError(
                    f"A run named {name!r} ({status}) already exists at {storage.uri()}. Pick another "
                    "RunConfig.name, or pass RunConfig(if_exists='overwrite') to delete it and start over"
                    + (", or continue it with TorchTrainer.restore(path)." if status == "FINISHED"
                       else ", or RunConfig(if_exists='resume') to continue it from its latest checkpoint.")
                )
            if rc.if_exists == "overwrite":
                logger.warning("Deleting the existing run %s (RunConfig.if_exists='overwrite')", storage.uri())
                storage.remove_run()
            else:
                storage.remove_uncommitted()
                committed = storage.committed_checkpoints()
                rows = storage.read_metrics_log()
                logger.warning("Run %r exists (%s) at %s: resuming it from %s (RunConfig.if_exists='resume').",
                               name, status, storage.uri(),
                               committed[-1].path if committed else "the start (it has no committed checkpoint)")
                state = previous
                state["resumed"] = state.get("resumed", 0) + 1
                return storage, state, committed, rows
        state = {
            "name": name, "status": "PENDING", "created_at": time.time(), "trainlib_version": _version(),
            "storage_path": storage.uri(storage.root),
            "train_loop_config": self.train_loop_config, "scaling_config": _public_fields(self.scaling_config),
            "checkpoint_config": _public_fields(rc.checkpoint_config),
            "failure_config": _public_fields(rc.failure_config), "callbacks": {},
        }
        storage.write_bytes_atomic(storage.join(TRAINER_FILE), cloudpickle.dumps({
            "train_loop_per_worker": self.train_loop_per_worker, "train_loop_config": self.train_loop_config,
            "scaling_config": self.scaling_config,
        }))
        return storage, state, committed, rows

    def _end_run(self, storage: RunStorage, state: dict[str, Any], controller: Controller,
                 error: BaseException | None) -> Result:
        state["status"] = "FINISHED" if error is None else "FAILED"
        state["error"] = None if error is None else f"{type(error).__name__}: {error}"[:4000]
        state["failures"] = [{"rank": f.rank, "cause": f.cause} for f in controller.failures]
        state["ended_at"] = time.time()
        try:
            storage.write_json_atomic(storage.join(RUN_STATE_FILE), state)
        except Exception as exc:  # noqa: BLE001 - keep the original error
            if error is None:
                raise
            logger.warning("Could not record the run's FAILED state: %s", exc)
        try:
            result = Result.from_storage(storage, self.run_config.checkpoint_config,
                                         error if isinstance(error, Exception) else None)
        except Exception as exc:  # noqa: BLE001 - after a failure, storage may be what failed
            if error is None:
                raise
            logger.warning("Could not read the failed run back from storage: %s", exc)
            result = Result(metrics=None, checkpoint=None, path=storage.uri(), error=error)
        for callback in self.run_config.callbacks:
            try:
                callback.after_run(controller.run_info, result)
            except Exception as exc:  # noqa: BLE001 - training is over; report and go on
                logger.warning("Callback %s.after_run failed: %s", type(callback).__name__, exc)
        if error is None and self.run_config.verbose:
            logger.info("Run %s finished: %d report(s), latest checkpoint %s", storage.name,
                        len(controller.metrics_rows), result.checkpoint.uri if result.checkpoint else None)
        return result


def _public_fields(config: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if not f.name.startswith("_")}


def _log_to_console() -> None:
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s trainlib %(levelname)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


__all__ = ["DataParallelTrainer", "TrainingFailedError"]
