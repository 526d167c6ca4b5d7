"""``TrainContext`` and the worker-side functions ``report``, ``get_context``, ``get_checkpoint``. Worker actors only."""

from __future__ import annotations

from typing import Any

from trainlib._internal.execution.session import WorkerSession, get_session
from trainlib.checkpoint import Checkpoint


class TrainContext:
    """What a worker knows about its run: ranks, sizes, names. Get it with ``get_context()``."""

    def __init__(self, session: WorkerSession):
        self._info = session.info
        self._attempt = session.attempt

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

    def __repr__(self) -> str:
        i = self._info
        return (f"TrainContext(world_rank={i.world_rank}, world_size={i.world_size}, local_rank={i.local_rank}, "
                f"node_rank={i.node_rank}, experiment_name={self._attempt.experiment_name!r})")


def report(metrics: dict[str, Any], checkpoint: Checkpoint | None = None) -> None:
    """Report metrics, and optionally a checkpoint, from every worker.

    Every rank must call ``report`` the same number of times. Rank 0's metrics
    become the run's metrics; the files of all ranks' checkpoints are merged into
    one checkpoint, committed once every rank has reported. Training waits only
    while the checkpoint folder is copied locally; remote uploads happen in the
    background. The folder may be deleted as soon as ``report`` returns.

    Args:
        metrics: a flat dict of numbers, e.g. ``{"loss": loss.item(), "epoch": epoch}``.
        checkpoint: ``trainlib.Checkpoint.from_directory(folder)``.

    Raises:
        TypeError: ``metrics`` is not a dict of numbers.
        RuntimeError: called outside a training worker.
    """
    get_session("report").report(metrics, checkpoint)


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
