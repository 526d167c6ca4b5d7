"""The typed options and records of ``report()``: upload modes and reported checkpoints. Used in workers.

Example:
    >>> trainlib.report(metrics, checkpoint=checkpoint, checkpoint_upload_mode=trainlib.CheckpointUploadMode.ASYNC)
    >>> for reported in trainlib.get_all_reported_checkpoints():
    ...     print(reported.checkpoint, reported.metrics["loss"])
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainlib.checkpoint import Checkpoint


class CheckpointUploadMode(enum.Enum):
    """How ``report()`` moves a checkpoint into run storage.

    Members:
        SYNC: ``report()`` returns once the checkpoint's files are copied (into run
            storage on a local or shared disk; to a private local staging copy,
            uploaded in the background, for remote storage). The folder may be
            deleted as soon as ``report()`` returns.
        ASYNC: ``report()`` returns at once; the files are copied from the folder in
            the background, and the folder is deleted after the copy unless
            ``delete_local_checkpoint_after_upload=False``. Do not delete or
            change the folder yourself (use ``tempfile.mkdtemp()``, not a
            ``TemporaryDirectory`` block).
        NO_UPLOAD: nothing is copied: the checkpoint is already in the run's folder
            (written there through ``get_context().get_storage()``) and is
            committed where it is.
    """

    ASYNC = "ASYNC"
    SYNC = "SYNC"
    NO_UPLOAD = "NO_UPLOAD"

    def default_delete_local_checkpoint_after_upload(self) -> bool:
        """Ray Train's default: delete the local folder after an ASYNC upload only."""
        return self is CheckpointUploadMode.ASYNC


class CheckpointConsistencyMode(enum.Enum):
    """What ``get_all_reported_checkpoints()`` waits for: the committed checkpoints (trainlib has no
    validation step, so VALIDATED and COMMITTED wait for the same thing)."""

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


class ReportedCheckpointStatus(enum.Enum):
    """The state of a reported checkpoint: trainlib's are all COMMITTED (no validation step)."""

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


@dataclasses.dataclass
class ReportedCheckpoint:
    """A committed checkpoint of the run and the metrics reported with it."""

    checkpoint: Checkpoint
    metrics: dict[str, Any]
    status: ReportedCheckpointStatus = ReportedCheckpointStatus.COMMITTED
