"""Messages a worker sends to the driver, in order: reports, then done or failed. Built in workers, read on the driver.

Each rank's stream is ``ReportMessage*`` followed by exactly one ``DoneMessage`` or
``FailedMessage``; the worker group adds a ``FailedMessage`` for a rank whose process died.
"""

from __future__ import annotations

import dataclasses
import enum
import queue
import traceback
from typing import Any, ClassVar


class MessageKind(enum.Enum):
    REPORT = "report"
    DONE = "done"
    FAILED = "failed"


@dataclasses.dataclass(frozen=True)
class CheckpointPlacement:
    """Where a rank's checkpoint files of one report went."""

    dir_name: str  # the checkpoint's folder in the run folder
    in_place: bool = False  # written there by the user (NO_UPLOAD, checkpoint_upload_fn): list it at commit


@dataclasses.dataclass(frozen=True)
class ReportMessage:
    """One ``trainlib.report()`` of one rank, after its checkpoint files reached run storage."""

    kind: ClassVar[MessageKind] = MessageKind.REPORT
    rank: int
    step: int
    metrics: dict[str, Any]
    manifest: dict[str, int] | None  # the checkpoint's files {relpath: size}, None without a checkpoint
    reported_at: float
    placement: CheckpointPlacement | None = None  # the checkpoint's folder, None without a checkpoint


@dataclasses.dataclass(frozen=True)
class DoneMessage:
    """The rank's training function returned and every report before it was sent."""

    kind: ClassVar[MessageKind] = MessageKind.DONE
    rank: int
    # Rank 0's return value, pickled in the worker (``Result.return_value``); None for other ranks, for None, and
    # for a value that could not be pickled (the worker warned).
    return_payload: bytes | None = None

    def return_value(self) -> Any:
        if self.return_payload is None:
            return None
        from ray import cloudpickle

        return cloudpickle.loads(self.return_payload)


@dataclasses.dataclass(frozen=True)
class FailedMessage:
    """The rank failed: its exception (text, traceback, pickled if it can be), or its process died."""

    kind: ClassVar[MessageKind] = MessageKind.FAILED
    rank: int
    cause: str
    traceback_text: str = ""
    exception_payload: bytes | None = None  # cloudpickle of the exception, None when unpicklable

    @classmethod
    def from_exception(cls, rank: int, exc: BaseException) -> FailedMessage:
        from ray import cloudpickle

        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        try:
            payload = cloudpickle.dumps(exc)
        except Exception:  # noqa: BLE001 - unpicklable exceptions travel as text only
            payload = None
        return cls(rank=rank, cause=f"{type(exc).__name__}: {exc}", traceback_text=text, exception_payload=payload)


WorkerMessage = ReportMessage | DoneMessage | FailedMessage


def is_last(message: WorkerMessage) -> bool:
    """Whether ``message`` ends its rank's stream (nothing follows a done or a failure)."""
    return message.kind is not MessageKind.REPORT


def drained(outbox: queue.Queue[Any], messages: list[Any]) -> list[Any]:
    """``messages`` and then everything queued in ``outbox`` now, in order (a rank's outbox, either side)."""
    while True:
        try:
            messages.append(outbox.get_nowait())
        except queue.Empty:
            return messages
