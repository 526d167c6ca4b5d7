"""The per-worker training session behind ``report``, ``get_context`` and ``get_checkpoint``. Worker actors only.

The session holds the worker's place in the group, its attempt and its device, and numbers its reports.
``report()`` validates the metrics, has the checkpoint's files placed (``report_checkpoint.py``: straight into run
storage on a local filesystem; to a local staging folder first for remote storage), and hands the report to one
uploader thread (``report_uploader.py``), which uploads in the background and forwards reports to the driver in
order. Training waits only for the local copy.
"""

from __future__ import annotations

import queue
import shutil
import time
from typing import Any

from trainlib._internal import metrics as metric_values
from trainlib._internal import tunables
from trainlib._internal.execution import staging
from trainlib._internal.execution.messages import DoneMessage, FailedMessage, WorkerMessage
from trainlib._internal.execution.report_checkpoint import CheckpointPlacer, PendingReport, ReportOptions
from trainlib._internal.execution.report_uploader import ReportUploader
from trainlib._internal.execution.return_value import pickled_return_value
from trainlib._internal.execution.spec import AttemptSpec, WorkerInfo
from trainlib.checkpoint import Checkpoint


class WorkerSession:
    """One worker's session: the state behind the public worker-side functions."""

    def __init__(
        self,
        info: WorkerInfo,
        attempt: AttemptSpec,
        outbox: queue.Queue[WorkerMessage],
        metadata: dict[str, Any] | None = None,
        dataset_shards: dict[str, Any] | None = None,
    ):
        self.info = info
        self.attempt = attempt
        self.storage = attempt.storage
        self.start_checkpoint = attempt.checkpoint
        self.first_step = self.next_step = attempt.first_step
        self.device: Any = None  # set by the worker backend once the device is chosen (e.g. torch.device)
        self.metadata = metadata
        self.dataset_shards = dataset_shards or {}
        self.preemption: Any = None  # a trainlib.PreemptionInfo once the driver sees a node of the run draining
        self.collective_actor: Any = None  # the attempt's trainlib.collective actor, once a collective is called
        self.collective_seq = 0  # the number of this rank's next collective call (the same on every rank)
        self.outbox = outbox
        self._in_report = False  # the training thread is inside report()
        self.abort: BaseException | None = None  # local mode: the controller failed; the next report() raises it
        # Only remote storage stages checkpoints (report() copies straight into local storage): a folder made for
        # nothing would outlive a killed worker, and the driver recovers staged files for remote storage only.
        self._staging_root = (
            None
            if self.storage.is_local
            else staging.make_staging_root(info.world_rank, self.storage.run_path, attempt.attempt)
        )
        self._placer = CheckpointPlacer(self.storage, self._staging_root)
        self._uploads = ReportUploader(info.world_rank, self.storage, outbox, on_last=self._remove_staging_root)

    # -- called from the training thread ---------------------------------------

    def report(
        self, metrics: dict[str, Any], checkpoint: Checkpoint | None = None, options: ReportOptions | None = None
    ) -> None:
        if self.abort is not None:
            raise self.abort
        # A flush after another rank failed waits for a report() under way too (copying its checkpoint): every
        # rank may have made that report by the time it is queued, and the driver commits it then.
        self._in_report = True
        try:
            self._report(metrics, checkpoint, options)
        finally:
            self._in_report = False

    def _report(self, metrics: dict[str, Any], checkpoint: Checkpoint | None, options: ReportOptions | None) -> None:
        options = options or ReportOptions()
        clean = metric_values.clean_metrics(metrics)
        if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
            raise TypeError(
                f"trainlib.report(checkpoint=...) takes a trainlib.Checkpoint, got {type(checkpoint).__name__}. "
                "Use trainlib.Checkpoint.from_directory(folder)."
            )
        step = self.next_step
        pending = PendingReport(step, clean, None, None, time.time())
        if checkpoint is not None:
            self._placer.place(pending, checkpoint, options)
        if pending.staged_dir is not None:  # what the node needs to finish the upload if this process dies
            staging.write_record(pending.staged_dir, step, clean, pending.reported_at, pending.placement)
        self.next_step += 1
        self._uploads.put(pending)

    def wait_committed(self, timeout_s: float | None) -> None:
        """Block until every report this worker made has been committed by the driver (it is in the log)."""
        self.wait_uploads(timeout_s if timeout_s is not None else float("inf"))
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else float("inf"))
        while True:
            if self.abort is not None:
                raise self.abort
            steps = {row["step"] for row in self.storage.read_metrics_log()}
            if all(step in steps for step in range(self.first_step, self.next_step)):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"get_all_reported_checkpoints(timeout_s={timeout_s}): reports {sorted(set(range(self.first_step, self.next_step)) - steps)} "
                    "were not committed in time; every rank must call report() the same number of times."
                )
            time.sleep(tunables.COMMIT_POLL_INTERVAL_S)

    def finish(self, error: BaseException | None = None, return_value: Any = None) -> None:
        """Queue the end of training (after every pending upload) for the driver, with rank 0's return value."""
        if error is None:
            payload = pickled_return_value(return_value) if self.info.world_rank == 0 else None
            self._uploads.put(DoneMessage(self.info.world_rank, return_payload=payload))
        else:
            self._uploads.put(FailedMessage.from_exception(self.info.world_rank, error))

    def close(self) -> None:
        """Remove this worker's staging folder (the group is being torn down)."""
        self._remove_staging_root()

    def _remove_staging_root(self) -> None:
        if self._staging_root is not None:
            shutil.rmtree(self._staging_root, ignore_errors=True)

    def wait_uploads(self, timeout: float) -> bool:
        """Wait until every report made or under way reached the driver's outbox; True if it did in time."""
        deadline = time.monotonic() + timeout
        while (self._in_report or self._uploads.unfinished()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return not (self._in_report or self._uploads.unfinished())


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
