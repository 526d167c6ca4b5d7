"""``barrier`` and ``broadcast_from_rank_zero``: Ray Train's ``ray.train.collective``. Worker actors only.

Both go through a small Ray actor of the attempt (not torch.distributed), so they work with any trainer and before
or without a process group, as in Ray Train. Every rank must make the same calls in the same order.
``RAY_TRAIN_COLLECTIVE_TIMEOUT_S`` bounds the wait (unset: no bound; a group that loses a rank fails anyway), and
rank 0 logs the ranks still missing every ``RAY_TRAIN_COLLECTIVE_WARN_INTERVAL_S`` seconds (default 60).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TypeVar

from trainlib._internal import tunables
from trainlib._internal.execution.session import WorkerSession, get_session
from trainlib.errors import TrainlibError

__all__ = ["CollectiveTimeoutError", "barrier", "broadcast_from_rank_zero"]

T = TypeVar("T")
logger = logging.getLogger("trainlib")


class CollectiveTimeoutError(TrainlibError, TimeoutError):
    """A collective call waited longer than ``RAY_TRAIN_COLLECTIVE_TIMEOUT_S`` for the other ranks.

    Attributes:
        missing_ranks: the ranks that had not joined the call.
    """

    def __init__(self, caller: str, elapsed_s: float, missing_ranks: list[int], timeout_s: float):
        self.missing_ranks = missing_ranks
        super().__init__(
            f"The collective operation {caller} timed out after {elapsed_s:.2f} seconds. The following ranks have "
            f"not joined the collective operation: {missing_ranks}. You can set the timeout with the "
            f"{tunables.COLLECTIVE_TIMEOUT_S_ENV_VAR} environment variable (current value: {timeout_s:.2f} "
            "seconds). Disable the timeout by setting the environment variable to `None`."
        )


def broadcast_from_rank_zero(data: T) -> T:
    """Rank 0's ``data`` on every rank (small data: a warning above 1000 pickled bytes). Also a barrier.

    Example:
        >>> data = {"vocab_size": 30522} if trainlib.get_context().get_world_rank() == 0 else None
        >>> data = broadcast_from_rank_zero(data)

    Raises:
        RuntimeError: called outside a training worker.
        TypeError or pickle.PicklingError: ``data`` cannot be pickled.
        CollectiveTimeoutError: see the module's docstring.
    """
    return _collective(get_session("broadcast_from_rank_zero"), data, "trainlib.collective.broadcast_from_rank_zero")


def barrier() -> None:
    """Wait until every rank has called ``barrier()``.

    Raises:
        RuntimeError: called outside a training worker.
        CollectiveTimeoutError: see the module's docstring.
    """
    _collective(get_session("barrier"), None, "trainlib.collective.barrier")


def _collective(session: WorkerSession, data: T, caller: str) -> T:
    info = session.info
    if info.world_size == 1:  # local mode (num_workers=0) and one-worker groups: nothing to wait for
        return data
    if data is not None:
        from ray import cloudpickle

        size = len(cloudpickle.dumps(data))  # unpicklable data raises here, on the rank that passed it
        if size > tunables.MAX_BROADCAST_SIZE_BYTES:
            logger.warning(
                "Data size %d bytes exceeds the maximum broadcast size of %d bytes",
                size,
                tunables.MAX_BROADCAST_SIZE_BYTES,
            )
    import ray
    from ray.exceptions import GetTimeoutError

    from trainlib._internal.execution import rendezvous

    actor = session.collective_actor
    if actor is None:
        actor = session.collective_actor = rendezvous.get_or_create(session.storage.uri(), session.attempt.attempt)
    seq = session.collective_seq
    session.collective_seq += 1
    ref = actor.join.remote(seq, info.world_rank, info.world_size, data, caller)
    timeout_s = _timeout_s()
    warn_s = _env_seconds(tunables.COLLECTIVE_WARN_INTERVAL_S_ENV_VAR) or tunables.DEFAULT_COLLECTIVE_WARN_INTERVAL_S
    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        wait_s = warn_s if timeout_s is None else max(0.0, min(warn_s, timeout_s - elapsed))
        try:
            return ray.get(ref, timeout=wait_s)
        except GetTimeoutError:
            elapsed = time.monotonic() - started
            missing = ray.get(actor.missing_ranks.remote(seq))
            if timeout_s is not None and elapsed >= timeout_s:
                ray.cancel(ref)
                raise CollectiveTimeoutError(caller, elapsed, missing, timeout_s) from None
            if info.world_rank == 0:
                logger.warning(
                    "`%s` has not been called by all %d workers in the group. The workers have been waiting for "
                    "%.2f s for the following ranks to join the `%s` call: %s. Also ensure that workers are not "
                    "hanging on other operations, causing them to miss this synchronization barrier. You can set "
                    "the %s environment variable to change the frequency of this warning (current value: %s s).",
                    caller,
                    info.world_size,
                    elapsed,
                    caller,
                    missing,
                    tunables.COLLECTIVE_WARN_INTERVAL_S_ENV_VAR,
                    warn_s,
                )


def _env_seconds(name: str) -> float | None:
    value = os.environ.get(name, "").strip()
    if value in ("", "None", "none"):
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is invalid: use a number of seconds, or None.") from None
    if seconds <= 0:
        raise ValueError(f"{name}={value!r} is invalid: use a positive number of seconds, or None.")
    return seconds


def _timeout_s() -> float | None:
    return _env_seconds(tunables.COLLECTIVE_TIMEOUT_S_ENV_VAR)
