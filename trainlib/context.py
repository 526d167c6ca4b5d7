"""``TrainContext`` and the worker-side functions (``report``, ``get_context``, ``get_checkpoint``,
``get_all_reported_checkpoints``, ``get_dataset_shard``, ``get_preemption_info``). Worker actors only."""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainlib._internal.execution.report_checkpoint import ReportOptions
from trainlib._internal.execution.session import WorkerSession, get_session
from trainlib.checkpoint import Checkpoint
from trainlib.reporting import CheckpointConsistencyMode, CheckpointUploadMode, ReportedCheckpoint

if TYPE_CHECKING:
    from ray.data import DataIterator

    from trainlib.preemption import PreemptionInfo


@dataclasses.dataclass(frozen=True)
class StorageContext:
    """Where the run keeps its files, for code that writes there itself (``get_context().get_storage()``).

    Attributes:
        storage_filesystem: the run storage's fsspec filesystem.
        storage_fs_path: ``RunConfig.storage_path`` as a path inside that filesystem.
        experiment_dir_name: the run's folder name (``RunConfig.name``).
        experiment_fs_path: the run's folder, a path inside ``storage_filesystem``;
            a checkpoint reported with ``CheckpointUploadMode.NO_UPLOAD`` must be a folder in it.
    """

    storage_filesystem: Any
    storage_fs_path: str
    experiment_dir_name: str
    experiment_fs_path: str

    def build_checkpoint_path_from_name(self, checkpoint_dir_name: str) -> str:
        """The path, inside ``storage_filesystem``, of the checkpoint folder named ``checkpoint_dir_name``."""
        return posixpath.join(self.experiment_fs_path, checkpoint_dir_name)


class TrainContext:
    """What a worker knows about its run: ranks, sizes, names. Get it with ``get_context()``."""

    def __init__(self, session: WorkerSession):
        self._info = session.info
        self._attempt = session.attempt
        self._session = session

    def get_world_size(self) -> int:
        """Number of workers in the group."""
        return self._info.world_size

    def get_world_rank(self) -> int:
        """This worker's rank among all workers, 0 to world size - 1."""
        return self._info.world_rank

    def get_local_rank(self) -> int:
        """This worker's rank among the workers on its node."""
        return self._info.local_rank

    def get_local_world_size(self) -> int:
        """Number of workers on this worker's node."""
        return self._info.local_world_size

    def get_node_rank(self) -> int:
        """The rank of this worker's node among the group's nodes."""
        return self._info.node_rank

    def get_experiment_name(self) -> str:
        """The run's name (``RunConfig.name``)."""
        return self._attempt.experiment_name

    def get_trial_name(self) -> str:
        """Same as :meth:`get_experiment_name` (Ray Train v1 compatibility)."""
        return self._attempt.experiment_name

    def get_run_path(self) -> str:
        """The run's folder in storage."""
        return self._attempt.storage.uri()

    def get_attempt(self) -> int:
        """0 for the first attempt; then one more per restart, and per re-run of the same run (resume)."""
        return self._attempt.attempt

    def get_storage(self) -> StorageContext:
        """The run's storage: filesystem and paths (see :class:`StorageContext`)."""
        storage = self._session.storage
        return StorageContext(
            storage_filesystem=storage.fs,
            storage_fs_path=storage.root,
            experiment_dir_name=storage.name,
            experiment_fs_path=storage.run_path,
        )

    def get_metadata(self) -> dict[str, Any]:
        """The ``metadata`` dict given to the trainer (``TorchTrainer(metadata=...)``), or ``{}``."""
        return dict(self._session.metadata or {})

    def __repr__(self) -> str:
        i = self._info
        return (
            f"TrainContext(world_rank={i.world_rank}, world_size={i.world_size}, local_rank={i.local_rank}, "
            f"node_rank={i.node_rank}, experiment_name={self._attempt.experiment_name!r})"
        )


def report(
    metrics: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    checkpoint_dir_name: str | None = None,
    checkpoint_upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC,
    delete_local_checkpoint_after_upload: bool | None = None,
    checkpoint_upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None,
    validation: Any = False,
) -> None:
    """Report metrics, and optionally a checkpoint, from every worker.

    Every rank must call ``report`` the same number of times. Rank 0's metrics
    become the run's metrics; the files of all ranks' checkpoints are merged into
    one checkpoint, committed once every rank has reported.

    Args:
        metrics: any picklable values, e.g. ``{"loss": loss.item(), "epoch": epoch, "phase": "warmup"}``.
            Numbers also go to MLflow as metrics; every value is kept in
            ``Result.metrics`` and ``Result.metrics_dataframe``. Torch tensors are refused: use ``.item()``.
        checkpoint: ``trainlib.Checkpoint.from_directory(folder)``.
        checkpoint_dir_name: the checkpoint's folder name in the run folder (default
            ``checkpoint_<step>``); unique per report, and the same on every rank.
        checkpoint_upload_mode: SYNC (default): the files are copied before ``report``
            returns (locally; remote uploads finish in the background), so the folder
            may be deleted at once. ASYNC: ``report`` returns at once and the copy runs
            in the background. NO_UPLOAD: the folder is already in the run folder; it
            is committed in place. See :class:`~trainlib.CheckpointUploadMode`.
        delete_local_checkpoint_after_upload: delete the local folder once copied
            (default: True for ASYNC only, as in Ray Train).
        checkpoint_upload_fn: ``fn(checkpoint, checkpoint_dir_name) -> Checkpoint``, your own
            upload into the run folder (``get_context().get_storage()``), used instead of trainlib's copy.
        validation: Ray Train's asynchronous checkpoint validation, which trainlib does not have:
            only ``False`` (the default) is accepted.

    Raises:
        TypeError: ``metrics`` is not a dict of picklable values, or an option has the wrong type.
        ValueError: ``checkpoint_dir_name`` is not a plain folder name; a NO_UPLOAD
            checkpoint is not in the run folder.
        RuntimeError: called outside a training worker.
    """
    if validation is not False:
        raise ValueError(
            f"report(validation={validation!r}): trainlib has no asynchronous checkpoint validation "
            "(Ray Train's ValidationConfig). Drop validation=, and compute validation metrics in the "
            "training function before report(), or on the checkpoint after fit()."
        )
    if not isinstance(checkpoint_upload_mode, CheckpointUploadMode):
        raise TypeError(
            f"report(checkpoint_upload_mode={checkpoint_upload_mode!r}): use "
            "trainlib.CheckpointUploadMode.SYNC, ASYNC or NO_UPLOAD."
        )
    if checkpoint_dir_name is not None and (
        not isinstance(checkpoint_dir_name, str)
        or not checkpoint_dir_name
        or "/" in checkpoint_dir_name
        or "\\" in checkpoint_dir_name
        or checkpoint_dir_name.startswith(".")
    ):
        raise ValueError(
            f"report(checkpoint_dir_name={checkpoint_dir_name!r}) is invalid: use a plain folder name "
            "such as 'epoch-3' (no '/', not starting with '.')."
        )
    if checkpoint_upload_fn is not None and not callable(checkpoint_upload_fn):
        raise TypeError("report(checkpoint_upload_fn=...) must be a function (checkpoint, dir_name) -> Checkpoint.")
    options = ReportOptions(
        dir_name=checkpoint_dir_name,
        upload_mode=checkpoint_upload_mode,
        delete_local=delete_local_checkpoint_after_upload,
        upload_fn=checkpoint_upload_fn,
    )
    get_session("report").report(metrics, checkpoint, options)


def get_all_reported_checkpoints(
    consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.VALIDATED, timeout_s: float | None = None
) -> list[ReportedCheckpoint]:
    """Every checkpoint of the run still kept (earlier attempts and resumed runs included), oldest first.

    Waits until every ``report`` this worker made has been committed, so call it on
    every rank, after the same reports.

    Args:
        consistency_mode: accepted for Ray Train compatibility; trainlib has no
            validation step, so both modes wait for the commits.
        timeout_s: wait at most this long (None: until the commits land).
    """
    if not isinstance(consistency_mode, CheckpointConsistencyMode):
        raise TypeError(
            "get_all_reported_checkpoints(consistency_mode=...) takes a trainlib.CheckpointConsistencyMode."
        )
    session = get_session("get_all_reported_checkpoints")
    session.wait_committed(timeout_s)
    storage = session.storage
    return [
        ReportedCheckpoint(checkpoint=Checkpoint(c.path, storage.fs), metrics=c.metrics)
        for c in storage.committed_checkpoints()
    ]


def get_dataset_shard(dataset_name: str | None = None) -> DataIterator | None:
    """This worker's ``ray.data.DataIterator`` over the dataset ``dataset_name`` given to the trainer.

    Iterate it once per epoch (``iter_torch_batches(batch_size=...)``); each epoch
    every worker reads its own disjoint part of the dataset, streamed as Ray Data
    produces it. Returns None when the trainer got no datasets.

    Raises:
        KeyError: no dataset of that name.
    """
    shards = get_session("get_dataset_shard").dataset_shards
    if not shards:
        return None
    if dataset_name is None:
        if len(shards) > 1:
            raise KeyError(f"get_dataset_shard(): the trainer has several datasets ({sorted(shards)}): name one.")
        return next(iter(shards.values()))
    if dataset_name not in shards:
        raise KeyError(f"get_dataset_shard({dataset_name!r}): the trainer's datasets are {sorted(shards)}.")
    return shards[dataset_name]


def get_preemption_info() -> PreemptionInfo | None:
    """The imminent preemption of a node of this run (Ray is draining it), or None.

    Save a checkpoint when it appears and keep training: when the node goes, the
    run restarts from the latest checkpoint, counted against
    ``FailureConfig.max_preemption_failures``.
    """
    return get_session("get_preemption_info").preemption


def get_context() -> TrainContext:
    """This worker's :class:`TrainContext` (ranks, world size, run name).

    Raises:
        RuntimeError: called outside a training worker.
    """
    return TrainContext(get_session("get_context"))


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from: the run's latest committed one after a restart or resume,
    ``resume_from_checkpoint`` on a fresh start, else None.

    Example:
        >>> checkpoint = trainlib.get_checkpoint()
        >>> if checkpoint:
        ...     with checkpoint.as_directory() as folder:
        ...         start_epoch = torch.load(os.path.join(folder, "state.pt"))["epoch"] + 1
    """
    return get_session("get_checkpoint").start_checkpoint
