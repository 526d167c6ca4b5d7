"""The per-worker training session behind ``report``, ``get_context`` and ``get_checkpoint``. Worker actors only.

The session holds the worker's place in the group, its attempt and its device. ``report()`` validates the metrics, copies the
checkpoint folder (straight into run storage on a local filesystem; to a local
staging folder first for remote storage), and hands the report to one uploader
thread, which uploads in the background and forwards reports to the driver in
order. Training waits only for the local copy.
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import queue
import shutil
import tempfile
import threading
import time
from typing import Any

from trainlib._internal import tunables
from trainlib._internal.execution.messages import DoneMessage, FailedMessage, ReportMessage, WorkerMessage
from trainlib._internal.execution.spec import AttemptSpec, WorkerInfo
from trainlib.checkpoint import Checkpoint


def validate_metrics(metrics: Any) -> dict[str, float | int]:
    """Check that ``metrics`` is a flat dict of numeric scalars; return plain Python numbers."""
    if not isinstance(metrics, dict):
        raise TypeError(
            f"trainlib.report(metrics=...) takes a dict of numbers, got {type(metrics).__name__}. "
            "Report e.g. trainlib.report({'loss': loss.item(), 'epoch': epoch})."
        )
    clean: dict[str, float | int] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"trainlib.report(): metric names must be strings, got {key!r}.")
        if isinstance(value, numbers.Number) and not isinstance(value, complex) and getattr(value, "ndim", 0) == 0:
            clean[key] = value.item() if hasattr(value, "item") else value
            continue
        hint = "call .item() on it" if hasattr(value, "item") and getattr(value, "ndim", 1) == 0 else \
            "report one number per key (a mean, a count), e.g. float(x)"
        raise TypeError(
            f"trainlib.report(): metrics[{key!r}] is {type(value).__name__} {_short(value)}, not a number: {hint}."
        )
    return clean


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclasses.dataclass
class _PendingReport:
    step: int
    metrics: dict[str, Any]
    staged_dir: str | None  # a local copy still to upload (remote storage)
    manifest: dict[str, int] | None  # files already in storage (local storage)
    reported_at: float


class WorkerSession:
    """One worker's session: the state behind the public worker-side functions."""

    def __init__(self, info: WorkerInfo, attempt: AttemptSpec, outbox: "queue.Queue[WorkerMessage]"):
        self.info = info
        self.attempt = attempt
        self.storage = attempt.storage
        self.start_checkpoint = attempt.checkpoint
        self.next_step = attempt.first_step
        self.device: Any = None  # set by the worker backend once the device is chosen (e.g. torch.device)
        self.outbox = outbox
        self._uploads: queue.Queue = queue.Queue(maxsize=tunables.MAX_PENDING_UPLOADS_PER_WORKER)
        self._staging_root = tempfile.mkdtemp(prefix=f"trainlib_stage_rank{info.world_rank}_")
        self._uploader = threading.Thread(target=self._upload_loop, name="trainlib-uploader", daemon=True)
        self._uploader.start()

    # -- called from the training thread ---------------------------------------

    def report(self, metrics: dict[str, Any], checkpoint: Checkpoint | None = None) -> None:
        clean = validate_metrics(metrics)
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"trainlib.report(checkpoint=...) takes a trainlib.Checkpoint, got {type(checkpoint).__name__}. "
                "Use trainlib.Checkpoint.from_directory(folder)."
            )
        step = self.next_step
        self.next_step += 1
        staged_dir = manifest = None
        if checkpoint is not None:
            if self.storage.is_local:
                # One copy, straight into the (not yet committed) checkpoint folder.
                manifest = self._copy_checkpoint_files(checkpoint, step)
            else:
                staged_dir = os.path.join(self._staging_root, f"step_{step}")
                checkpoint.to_directory(staged_dir)
        self._uploads.put(_PendingReport(step, clean, staged_dir, manifest, time.time()))

    def _copy_checkpoint_files(self, checkpoint: Checkpoint, step: int) -> dict[str, int]:
        if checkpoint.is_local:
            return self.storage.upload_directory(checkpoint.path, self.storage.checkpoint_path(step))
        with checkpoint.as_directory() as folder:
            return self.storage.upload_directory(folder, self.storage.checkpoint_path(step))

    def finish(self, error: BaseException | None = None) -> None:
        """Queue the end of training (after every pending upload) for the driver."""
        if error is None:
            self._uploads.put(DoneMessage(self.info.world_rank))
        else:
            self._uploads.put(FailedMessage.from_exception(self.info.world_rank, error))

    def wait_uploads(self, timeout: float) -> bool:
        """Wait until every queued report reached the driver's outbox; True if it did in time."""
        deadline = time.monotonic() + timeout
        while self._uploads.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self._uploads.unfinished_tasks

    # -- uploader thread ---------------------------------------------------------

    def _upload_loop(self) -> None:
        failed = False
        while True:
            item = self._uploads.get()
            try:
                if not isinstance(item, _PendingReport):  # done or failed: the last message of this session
                    if not failed:
                        self.outbox.put(item)
                    shutil.rmtree(self._staging_root, ignore_errors=True)
                    return
                if failed:
                    continue  # the driver already has this worker's failure; drain so report() never blocks
                manifest = item.manifest
                if item.staged_dir is not None:
                    manifest = self.storage.upload_directory(item.staged_dir, self.storage.checkpoint_path(item.step))
                    shutil.rmtree(item.staged_dir, ignore_errors=True)
                self.outbox.put(ReportMessage(rank=self.info.world_rank, step=item.step, metrics=item.metrics,
                                              manifest=manifest, reported_at=item.reported_at))
            except BaseException as exc:  # noqa: BLE001 - an upload failure fails this worker
                failed = True
                self.outbox.put(FailedMessage.from_exception(self.info.world_rank, exc))
            finally:
                self._uploads.task_done()


_session: WorkerSession | None = None


def set_session(session: WorkerSession | None) -> None:
    global _session
    _session = session


def current_session() -> WorkerSession | None:
    """This worker's session, or None outside a training worker."""
    return _session


def get_session(caller: str) -> WorkerSession:
    if _session is None:
        raise RuntimeError(
            f"trainlib.{caller}() was called outside a training worker. Call it inside the "
            "train_loop_per_worker function that you pass to TorchTrainer, which runs it on every worker."
        )
    return _session
