"""The one exception tree of trainlib, and when an I/O error is worth a retry. Driver and worker actors.

Every exception here is picklable (it crosses Ray process boundaries), so each
stores only plain strings and numbers and passes them all to ``__init__``.
"""

from __future__ import annotations


class TrainlibError(Exception):
    """Base class of every error trainlib raises on purpose."""


class RunExistsError(TrainlibError):
    """A run with the same name already exists in the storage path."""


class RunInUseError(RunExistsError):
    """Another driver owns the run (holds its lease): two drivers must never train into one run."""


class WorkerError(TrainlibError):
    """One worker's failure: which rank, on which node, and its original traceback."""

    def __init__(self, rank: int, cause: str, traceback_text: str = "", node_ip: str = "", pid: int | None = None):
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
    """``fit()`` failed: a :class:`WorkerGroupError` (the workers) or a :class:`ControllerError` (the driver).

    As in Ray Train, ``except trainlib.TrainingFailedError`` catches every way a run can fail once started.
    """


class WorkerGroupError(TrainingFailedError):
    """Training workers failed more often than ``FailureConfig`` allows.

    Attributes:
        worker_failures: world rank -> the exception that rank raised in the last
            attempt (the original exception object when it unpickles on the driver,
            else the rank's :class:`WorkerError`, whose text holds the traceback).
            A rank that failed only because a peer died first is listed too.
        failures: one :class:`WorkerError` per failed attempt, oldest first; the
            last one is the root cause of the final failure.
        max_failures: the ``FailureConfig.max_failures`` the run had.

    Example:
        >>> try:
        ...     trainer.fit()
        ... except trainlib.WorkerGroupError as error:
        ...     for rank, exc in error.worker_failures.items(): print(rank, repr(exc))
    """

    def __init__(
        self,
        failures: list[WorkerError],
        max_failures: int = 0,
        worker_failures: dict[int, BaseException] | None = None,
    ):
        self.failures = list(failures)
        self.max_failures = max_failures
        if worker_failures is None:
            last = self.failures[-1] if self.failures else None
            worker_failures = {last.rank: last.__cause__ or last} if last is not None else {}
        self.worker_failures = dict(worker_failures)
        super().__init__(self.failures, max_failures, self.worker_failures)

    def __str__(self) -> str:
        last = self.failures[-1]
        text = f"Training failed: {last}"
        if len(self.failures) > 1 or self.max_failures:
            attempts = "\n".join(f"  attempt {i + 1}: rank {f.rank}: {f.cause}" for i, f in enumerate(self.failures))
            text += (
                f"\n\nThe run failed {len(self.failures)} time(s) and FailureConfig(max_failures="
                f"{self.max_failures}) allows no more restarts. Failure history:\n{attempts}"
            )
        return text


class ControllerError(TrainingFailedError):
    """The driver side of a run failed (scheduling, storage, trainlib itself), not a worker.

    Attributes:
        controller_failure: the exception that stopped the controller (the error itself
            for :class:`ResourcesUnavailableError` and :class:`StorageError`).
    """

    def __init__(self, controller_failure: BaseException | str):
        if isinstance(controller_failure, BaseException):
            self.controller_failure = controller_failure
            message = (
                f"Training failed due to a controller error: {type(controller_failure).__name__}: {controller_failure}"
            )
        else:
            self.controller_failure = self
            message = controller_failure
        super().__init__(controller_failure)  # args: pickles back to the same error
        self._message = message

    def __str__(self) -> str:
        return self._message


class ResourcesUnavailableError(ControllerError):
    """The cluster can never hold, or did not grant in time, what the run asked for."""


class StorageError(ControllerError):
    """Run storage could not be read or written (after retries)."""


# Retrying I/O on transient errors: one rule for trainlib's storage and the pipeline's downloads. Defined in
# trainlib/_internal/util/retry.py, which imports this module's errors: re-exported when first asked for (PEP 562).
_RETRY_NAMES = ("describe_error", "is_transient", "with_retries")


def __getattr__(name: str):
    if name in _RETRY_NAMES:
        from trainlib._internal.util import retry

        value = getattr(retry, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trainlib.errors' has no attribute {name!r}")
