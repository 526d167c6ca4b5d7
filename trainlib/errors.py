"""The one exception tree of trainlib. Used on the driver and in worker actors.

Every exception here is picklable (it crosses Ray process boundaries), so each
stores only plain strings and numbers and passes them all to ``__init__``.
"""

from __future__ import annotations


class TrainlibError(Exception):
    """Base class of every error trainlib raises on purpose."""


class ResourcesUnavailableError(TrainlibError):
    """The cluster can never hold, or did not grant in time, what the run asked for."""


class StorageError(TrainlibError):
    """Run storage could not be read or written (after retries)."""


class RunExistsError(TrainlibError):
    """A run with the same name already exists in the storage path."""


class WorkerError(TrainlibError):
    """One worker's failure: which rank, on which node, and its original traceback."""

    def __init__(self, rank: int, cause: str, traceback_text: str = "", node_ip: str = "",
                 pid: int | None = None):
        self.rank = rank
        self.cause = cause
        self.traceback_text = traceback_text
        self.node_ip = node_ip
        self.pid = pid
        where = (f" (node {node_ip}" + (f", pid {pid}" if pid is not None else "") + ")") if node_ip else ""
        super().__init__(rank, cause, traceback_text, node_ip, pid)
        self._message = f"worker rank {rank}{where} failed: {cause}"

    def __str__(self) -> str:
        if self.traceback_text:
            return f"{self._message}\n\n{self.traceback_text.rstrip()}"
        return self._message


class TrainingFailedError(TrainlibError):
    """``fit()`` failed: the last worker failure, with the history of every earlier one.

    Attributes:
        failures: one :class:`WorkerError` per failed attempt, oldest first.
    """

    def __init__(self, failures: list[WorkerError], max_failures: int = 0):
        self.failures = list(failures)
        self.max_failures = max_failures
        super().__init__(self.failures, max_failures)

    def __str__(self) -> str:
        last = self.failures[-1]
        text = f"Training failed: {last}"
        if len(self.failures) > 1 or self.max_failures:
            attempts = "\n".join(
                f"  attempt {i + 1}: rank {f.rank}: {f.cause}" for i, f in enumerate(self.failures)
            )
            text += (
                f"\n\nThe run failed {len(self.failures)} time(s) and FailureConfig(max_failures="
                f"{self.max_failures}) allows no more restarts. Failure history:\n{attempts}"
            )
        return text
