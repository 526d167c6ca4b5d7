"""The worker-side functions of the public API. Called in worker actors only."""

from __future__ import annotations

from typing import Any

from trainlib._internal.checkpoint import Checkpoint
from trainlib._internal.session import TrainContext, get_session


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
    return get_session("get_context").context


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
