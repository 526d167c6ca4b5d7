"""The uploader thread of one worker's session. Runs in worker actors only (and in local mode).

``report()`` queues each report (``PendingReport``) and returns; this thread uploads what is still to upload
(an ASYNC copy, a staged folder for remote storage), in report order, and forwards each report to the driver's
outbox. The session's last message (done or failed) goes after every report queued before it. An upload that
fails fails the worker: later reports are drained, never sent, so ``report()`` never blocks on a full queue.
"""

from __future__ import annotations

import queue
import shutil
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from trainlib._internal import tunables
from trainlib._internal.execution import staging
from trainlib._internal.execution.messages import FailedMessage, ReportMessage, WorkerMessage
from trainlib._internal.execution.report_checkpoint import PendingReport

if TYPE_CHECKING:
    from trainlib._internal.storage.run_storage import RunStorage


class ReportUploader:
    """The queue of a session's reports and the thread that uploads them and sends them on, in order."""

    def __init__(self, rank: int, storage: RunStorage, outbox: queue.Queue[WorkerMessage], on_last: Callable[[], None]):
        self.rank = rank
        self.storage = storage
        self.outbox = outbox
        self._on_last = on_last  # after the last message: the session removes its staging folder
        self._queue: queue.Queue = queue.Queue(maxsize=tunables.MAX_PENDING_UPLOADS_PER_WORKER)
        self._thread = threading.Thread(target=self._loop, name="trainlib-uploader", daemon=True)
        self._thread.start()

    def put(self, item: PendingReport | WorkerMessage) -> None:
        """Queue a report, or the session's last message (done or failed); blocks while the queue is full."""
        self._queue.put(item)

    def unfinished(self) -> int:
        """How many queued items are not yet sent on (or dropped after a failure)."""
        return self._queue.unfinished_tasks

    def _loop(self) -> None:
        failed = False
        while True:
            item = self._queue.get()
            try:
                if not isinstance(item, PendingReport):  # done or failed: the last message of this session
                    if not failed:
                        self.outbox.put(item)
                    self._on_last()
                    return
                if failed:
                    continue  # the driver already has this worker's failure; drain so report() never blocks
                manifest = item.manifest
                if item.upload is not None:
                    manifest = item.upload()
                if item.staged_dir is not None:
                    dest = self.storage.checkpoint_path(item.step, item.placement.dir_name if item.placement else None)
                    manifest = self.storage.upload_directory(item.staged_dir, dest)
                    staging.write_record(
                        item.staged_dir, item.step, item.metrics, item.reported_at, item.placement, manifest
                    )
                    shutil.rmtree(item.staged_dir, ignore_errors=True)
                self.outbox.put(
                    ReportMessage(
                        rank=self.rank,
                        step=item.step,
                        metrics=item.metrics,
                        manifest=manifest,
                        reported_at=item.reported_at,
                        placement=item.placement,
                    )
                )
            except BaseException as exc:  # noqa: BLE001 - an upload failure fails this worker
                failed = True
                self.outbox.put(FailedMessage.from_exception(self.rank, exc))
            finally:
                self._queue.task_done()
