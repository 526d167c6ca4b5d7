"""Opening and closing a run's folder for ``fit()``: new, resumed or overwritten; its run record kept. Driver only."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ray import cloudpickle  # the pickler of train_fn.py

from trainlib._internal import tunables
from trainlib._internal.execution.train_fn import TrainFunction
from trainlib._internal.storage.commits import CommittedCheckpoint
from trainlib._internal.storage.run_record import RunFailure, RunRecord, RunStatus
from trainlib._internal.storage.run_storage import RunStorage
from trainlib._internal.util.filesystem import declares_shared, resolve_filesystem
from trainlib._internal.util.versions import trainlib_version
from trainlib.callbacks import Callback, RunInfo
from trainlib.config import RunConfig
from trainlib.data import DataConfig
from trainlib.errors import RunExistsError
from trainlib.result import Result
from trainlib.scaling import ScalingConfig

if TYPE_CHECKING:
    from trainlib._internal.execution.controller import Controller

logger = logging.getLogger("trainlib")

# The bound training function, the scaling config and RestoreExtras, for ``restore``: a pickled dict of named
# fields (the folders of earlier versions hold one too, some with other fields: SavedTrainer.load reads both).
TRAINER_FILE = "trainer.pkl"


@dataclasses.dataclass(frozen=True)
class RestoreExtras:
    """What else ``fit()`` stores for ``restore``, besides the function and the scaling config."""

    dataset_config: DataConfig | None = None
    dataset_names: tuple[str, ...] = ()  # the datasets restore() must be given again (they are not stored)
    metadata: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class SavedTrainer:
    """The trainer that ``fit()`` stored in a run folder (:data:`TRAINER_FILE`), as ``restore`` reads it."""

    train_loop_per_worker: (
        Callable[..., Any] | None
    )  # None: a local-mode run whose function or config could not be pickled
    train_loop_config: dict | None
    scaling_config: ScalingConfig
    extras: RestoreExtras

    @classmethod
    def load(cls, storage: RunStorage) -> SavedTrainer:
        saved = cloudpickle.loads(storage.fs.cat_file(storage.join(TRAINER_FILE)))
        if "train_fn" in saved:  # a TrainFunction, or None
            func, config = saved["train_fn"].unpack() if saved["train_fn"] is not None else (None, None)
        else:  # a run folder written before the function was bound once
            func, config = saved["train_loop_per_worker"], saved["train_loop_config"]
        extras = RestoreExtras(
            dataset_config=saved.get("dataset_config"),
            dataset_names=tuple(saved.get("dataset_names") or ()),
            metadata=saved.get("metadata"),
        )
        return cls(func, config, saved["scaling_config"], extras)


@dataclasses.dataclass
class OpenedRun:
    """A run folder ready for the controller: its record and what earlier attempts committed."""

    storage: RunStorage
    record: RunRecord
    committed: list[CommittedCheckpoint]
    metrics_rows: list[dict[str, Any]]


def public_fields(config: Any) -> dict[str, Any]:
    """A config dataclass as a JSON-able dict of its public fields."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if not f.name.startswith("_")}


def run_storage(run_config: RunConfig, name: str) -> RunStorage:
    """The folder of run ``name`` under ``RunConfig.storage_path`` (nothing is read or written yet)."""
    rc = run_config
    fs, root = resolve_filesystem(rc.storage_path, rc.storage_filesystem, rc.storage_options)
    return RunStorage(fs, root, name, shared=declares_shared(rc.storage_path))


def open_run(
    run_config: RunConfig,
    name: str,
    *,
    restoring: bool,
    train_fn: TrainFunction | None,
    train_loop_config: dict | None,
    scaling_config: ScalingConfig,
    storage: RunStorage | None = None,
    extras: RestoreExtras | None = None,
) -> OpenedRun:
    """Create the run folder, or resume or overwrite the one there per ``RunConfig.if_exists``.

    ``fit()`` passes the ``storage`` whose lease it holds, so no other driver changes the folder meanwhile.
    """
    rc = run_config
    storage = storage or run_storage(rc, name)
    if storage.exists():
        previous = RunRecord.load(storage)
        status = previous.status.value
        if rc.if_exists == "error" or (
            previous.status is RunStatus.FINISHED and not restoring and rc.if_exists != "overwrite"
        ):
            raise RunExistsError(
                f"A run named {name!r} ({status}) already exists at {storage.uri()}. Pick another "
                "RunConfig.name, or pass RunConfig(if_exists='overwrite') to delete it and start over"
                + (
                    ", or continue it with TorchTrainer.restore(path)."
                    if previous.status is RunStatus.FINISHED
                    else ", or RunConfig(if_exists='resume') to continue it from its latest checkpoint."
                )
            )
        if rc.if_exists == "overwrite":
            logger.warning("Deleting the existing run %s (RunConfig.if_exists='overwrite')", storage.uri())
            storage.remove_run()
        else:
            storage.remove_uncommitted()
            committed = storage.committed_checkpoints()
            logger.warning(
                "Run %r exists (%s) at %s: resuming it from %s (RunConfig.if_exists='resume').",
                name,
                status,
                storage.uri(),
                committed[-1].path if committed else "the start (it has no committed checkpoint)",
            )
            previous.resumed += 1
            rows = storage.read_metrics_log()
            storage.repair_metrics_log(rows)  # a crash may have torn its last line
            return OpenedRun(storage, previous, committed, rows)
    record = RunRecord(
        name=name,
        storage_path=storage.uri(storage.root),
        trainlib_version=trainlib_version(),
        train_loop_config=train_loop_config,
        scaling_config=public_fields(scaling_config),
        checkpoint_config=public_fields(rc.checkpoint_config),
        failure_config=public_fields(rc.failure_config),
    )
    saved = {"train_fn": train_fn, "scaling_config": scaling_config, **public_fields(extras or RestoreExtras())}
    storage.write_bytes_atomic(storage.join(TRAINER_FILE), cloudpickle.dumps(saved))
    return OpenedRun(storage, record, [], [])


def start_run(run: OpenedRun, run_info: RunInfo, callbacks: list[Callback]) -> None:
    """Run the callbacks' ``before_run`` (any may stop the run), then record the run as RUNNING."""
    for callback in callbacks:
        callback.load_state_dict(dict(run.record.callbacks.get(callback.state_key) or {}))
    for callback in callbacks:
        callback.before_run(run_info)  # may raise: nothing has started yet
    _save_callback_states(run.record, callbacks)
    run.record.status = RunStatus.RUNNING
    run.record.save(run.storage)


def close_run(
    run: OpenedRun, run_config: RunConfig, run_info: RunInfo, controller: Controller, error: BaseException | None
) -> Result:
    """Record how the run ended, read its ``Result`` back and tell the callbacks."""
    storage, record = run.storage, run.record
    record.status = RunStatus.FINISHED if error is None else RunStatus.FAILED
    record.error = None if error is None else f"{type(error).__name__}: {error}"[:4000]
    record.failures = [RunFailure(rank=f.rank, cause=f.cause) for f in controller.restarts.failures]
    record.ended_at = time.time()
    if error is None:
        controller.commits.apply_retention(keep_latest=False)  # a finished run needs no checkpoint to resume from
    try:
        record.save(storage)
    except Exception as exc:  # noqa: BLE001 - keep the original error
        if error is None:
            raise
        logger.warning("Could not record the run's FAILED state: %s", exc)
    try:
        result = Result.from_storage(
            storage,
            run_config.checkpoint_config,
            error if isinstance(error, Exception) else None,
            filesystem=run_config.storage_filesystem,
        )
    except Exception as exc:  # noqa: BLE001 - after a failure, storage may be what failed
        if error is None:
            raise
        logger.warning("Could not read the failed run back from storage: %s", exc)
        result = Result(metrics=None, checkpoint=None, path=storage.run_path, error=error, _uri=storage.uri())
    if error is None:
        result.return_value = controller.return_value
    # The hooks queued during the run first, bounded: a tracking server that hangs does not hold
    # the run; then after_run, unless a callback is stuck.
    delivered = controller.callback_runner.drain(tunables.CALLBACK_DRAIN_TIMEOUT_S)
    for callback in run_config.callbacks if delivered else []:
        try:
            callback.after_run(run_info, result)
        except Exception as exc:  # noqa: BLE001 - training is over; report and go on
            logger.warning("Callback %s.after_run failed: %s", type(callback).__name__, exc)
    if _save_callback_states(record, run_config.callbacks):
        try:
            record.save(storage)
        except Exception as exc:  # noqa: BLE001 - the run's outcome is recorded already
            logger.warning("Could not save the callbacks' state in the run record: %s", exc)
    if error is None and run_config.verbose:
        logger.info(
            "Run %s finished: %d report(s), latest checkpoint %s",
            storage.name,
            len(controller.commits.metrics_rows),
            result.checkpoint.uri if result.checkpoint else None,
        )
    return result


def _save_callback_states(record: RunRecord, callbacks: list[Callback]) -> bool:
    """Copy each callback's ``state_dict()`` into the record; True when something changed."""
    changed = False
    for callback in callbacks:
        state = callback.state_dict()
        if state and record.callbacks.get(callback.state_key) != state:
            record.callbacks[callback.state_key] = dict(state)
            changed = True
    return changed
