"""The per-worker training session behind ``report``, ``get_context`` and ``get_checkpoint``. Worker actors only.

The session holds the worker's place in the group, its attempt and its device. ``report()`` validates the metrics, copies the
checkpoint folder (straight into run storage on a local filesystem; to a local
staging folder first for remote storage), and hands the report to one uploader
thread, which uploads in the background and forwards reports to the driver in
order. Training waits only for the local copy.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import queue
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from trainlib._internal import metrics as metric_values
from trainlib._internal import tunables
from trainlib._internal.execution import staging
from trainlib._internal.execution.messages import (
    CheckpointPlacement,
    DoneMessage,
    FailedMessage,
    ReportMessage,
    WorkerMessage,
)
from trainlib._internal.execution.spec import AttemptSpec, WorkerInfo
from trainlib._internal.storage.checkpoint_files import checkpoint_files
from trainlib._internal.storage.commits import checkpoint_dir_name
from trainlib.checkpoint import Checkpoint
from trainlib.reporting import CheckpointUploadMode


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    """The checkpoint options of one ``report()`` call (Ray Train's keyword arguments)."""

    dir_name: str | None = None
    upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC
    delete_local: bool | None = None
    upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None


@dataclasses.dataclass
class _PendingReport:
    step: int
    metrics: dict[str, Any]
    staged_dir: str | None  # a local copy still to upload (remote storage)
    manifest: dict[str, int] | None  # files already in storage (local storage)
    reported_at: float
    placement: CheckpointPlacement | None = None
    upload: Callable[[], dict[str, int]] | None = None  # an ASYNC upload, run by the uploader thread


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
        self._uploads: queue.Queue = queue.Queue(maxsize=tunables.MAX_PENDING_UPLOADS_PER_WORKER)
        self._in_report = False  # the training thread is inside report()
        self.abort: BaseException | None = None  # local mode: the controller failed; the next report() raises it
        self._dir_names: set[str] = set()  # the checkpoint_dir_names this rank copied into
        # Only remote storage stages checkpoints (report() copies straight into local storage): a folder made for
        # nothing would outlive a killed worker, and the driver recovers staged files for remote storage only.
        self._staging_root = (
            None
            if self.storage.is_local
            else staging.make_staging_root(info.world_rank, self.storage.run_path, attempt.attempt)
        )
        self._uploader = threading.Thread(target=self._upload_loop, name="trainlib-uploader", daemon=True)
        self._uploader.start()

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
        pending = _PendingReport(step, clean, None, None, time.time())
        if checkpoint is not None:
            self._place_checkpoint(pending, checkpoint, options)
        if pending.staged_dir is not None:  # what the node needs to finish the upload if this process dies
            staging.write_record(pending.staged_dir, step, clean, pending.reported_at, pending.placement)
        self.next_step += 1
        self._uploads.put(pending)

    def _place_checkpoint(self, pending: _PendingReport, checkpoint: Checkpoint, options: ReportOptions) -> None:
        """Copy (SYNC), schedule the copy of (ASYNC) or adopt (NO_UPLOAD) the checkpoint's files."""
        mode = options.upload_mode
        if mode is CheckpointUploadMode.NO_UPLOAD:
            pending.placement = CheckpointPlacement(self._folder_in_run(checkpoint), in_place=True)
            return
        dir_name = options.dir_name or checkpoint_dir_name(pending.step)
        if options.dir_name is not None:
            self._check_new_folder(dir_name)
        # What the folder holds now, when report() is called: an ASYNC copy made later must find exactly this.
        reported = _reported_files(checkpoint) if options.upload_fn is None else None
        pending.placement = CheckpointPlacement(dir_name, in_place=options.upload_fn is not None)
        delete = (
            options.delete_local
            if options.delete_local is not None
            else mode.default_delete_local_checkpoint_after_upload()
        )

        def upload() -> dict[str, int]:
            if options.upload_fn is not None:
                persisted = options.upload_fn(checkpoint, dir_name)
                if not isinstance(persisted, Checkpoint):
                    raise ValueError(
                        f"checkpoint_upload_fn must return a trainlib.Checkpoint, got {type(persisted).__name__}."
                    )
                pending.placement = CheckpointPlacement(self._folder_in_run(persisted), in_place=True)
                manifest = {}
            else:
                try:
                    manifest = self._copy_checkpoint_files(
                        checkpoint, self.storage.checkpoint_path(pending.step, dir_name)
                    )
                except FileNotFoundError as exc:
                    raise FileNotFoundError(f"{exc}: {_changed_folder(checkpoint, pending.step)}") from exc
                if reported is not None and manifest != reported:
                    raise FileNotFoundError(
                        f"{_changed_files(reported, manifest)}: {_changed_folder(checkpoint, pending.step)}"
                    )
            if delete and checkpoint.is_local:
                shutil.rmtree(checkpoint.path, ignore_errors=True)
            return manifest

        if mode is CheckpointUploadMode.ASYNC:
            pending.upload = upload  # the uploader thread runs it, in report order
        elif self.storage.is_local or options.upload_fn is not None:
            pending.manifest = upload()  # one copy, straight into the (not yet committed) checkpoint folder
        else:
            pending.staged_dir = os.path.join(self._staging_root, f"step_{pending.step}")
            staging.stage_checkpoint(checkpoint, pending.staged_dir)
            if delete and checkpoint.is_local:
                shutil.rmtree(checkpoint.path, ignore_errors=True)
        if options.dir_name is not None:
            self._dir_names.add(dir_name)

    def _check_new_folder(self, dir_name: str) -> None:
        """Refuse a checkpoint_dir_name used before: copying into a committed checkpoint's folder overwrites its
        files under its marker (a crash mid-copy leaves the old marker over new files, which verify when the sizes
        match), and retention deleted the folder as the older checkpoint's. This rank's earlier names are refused
        at once, before the driver has committed them; names of earlier attempts or runs by their marker."""
        if dir_name in self._dir_names or self.storage.holds_commit(self.storage.join(dir_name)):
            raise ValueError(
                f"trainlib.report(checkpoint_dir_name={dir_name!r}): that folder already holds a checkpoint of an "
                "earlier report, which copying into it would overwrite. Give each report its own folder name, e.g. "
                f'f"{dir_name}_{{epoch}}" (as in Ray Train, the name must be unique per report).'
            )

    def _folder_in_run(self, checkpoint: Checkpoint) -> str:
        """The name of ``checkpoint``'s folder, which must be a folder of the run's folder in run storage."""
        path = checkpoint.path.rstrip("/")
        if checkpoint.is_local != self.storage.is_local or posixpath.dirname(path) != self.storage.run_path:
            raise ValueError(
                f"The checkpoint {checkpoint.uri} is outside the run's folder ({self.storage.uri()}): with "
                "CheckpointUploadMode.NO_UPLOAD or a checkpoint_upload_fn the checkpoint must already be a folder "
                "in it; build its path from trainlib.get_context().get_storage().experiment_fs_path."
            )
        return posixpath.basename(path)

    def _copy_checkpoint_files(self, checkpoint: Checkpoint, dest: str) -> dict[str, int]:
        if checkpoint.is_local:
            return self.storage.upload_directory(checkpoint.path, dest)
        with checkpoint.as_directory() as folder:
            return self.storage.upload_directory(folder, dest)

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
            payload = _pickled_return_value(return_value) if self.info.world_rank == 0 else None
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
        while (self._in_report or self._uploads.unfinished_tasks) and time.monotonic() < deadline:
            time.sleep(0.05)
        return not (self._in_report or self._uploads.unfinished_tasks)

    # -- uploader thread ---------------------------------------------------------

    def _upload_loop(self) -> None:
        failed = False
        while True:
            item = self._uploads.get()
            try:
                if not isinstance(item, _PendingReport):  # done or failed: the last message of this session
                    if not failed:
                        self.outbox.put(item)
                    self._remove_staging_root()
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
                        rank=self.info.world_rank,
                        step=item.step,
                        metrics=item.metrics,
                        manifest=manifest,
                        reported_at=item.reported_at,
                        placement=item.placement,
                    )
                )
            except BaseException as exc:  # noqa: BLE001 - an upload failure fails this worker
                failed = True
                self.outbox.put(FailedMessage.from_exception(self.info.world_rank, exc))
            finally:
                self._uploads.task_done()


def _reported_files(checkpoint: Checkpoint) -> dict[str, int] | None:
    """The files {relpath: size} of a local checkpoint folder as report() finds it (None: a remote checkpoint).

    Raises:
        FileNotFoundError: the folder does not exist.
    """
    if not checkpoint.is_local:
        return None
    if not os.path.isdir(checkpoint.path):
        raise FileNotFoundError(
            f"trainlib.report(checkpoint=...): the checkpoint folder {checkpoint.path} does not exist (or is not a "
            "folder). Save the checkpoint's files into it before calling report()."
        )
    return {item.rel: item.size for item in checkpoint_files(checkpoint.path)}


def _changed_files(reported: dict[str, int], copied: dict[str, int]) -> str:
    missing = sorted(set(reported) - set(copied))
    resized = sorted(rel for rel in set(reported) & set(copied) if reported[rel] != copied[rel])
    added = sorted(set(copied) - set(reported))
    parts = [
        f"{label} {names[:5]}" + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        for label, names in (("missing", missing), ("with another size", resized), ("added", added))
        if names
    ]
    return f"of the {len(reported)} files reported, copied {len(copied)} ({'; '.join(parts)})"


def _changed_folder(checkpoint: Checkpoint, step: int) -> str:
    return (
        f"the checkpoint folder {checkpoint.path} of report {step} changed before it was copied, so that checkpoint "
        "is not committed. With CheckpointUploadMode.ASYNC the folder must stay as it is until the copy is done: "
        "make it with tempfile.mkdtemp() (trainlib deletes it after the upload), not a TemporaryDirectory block."
    )


def _pickled_return_value(value: Any) -> bytes | None:
    """``value`` pickled for ``Result.return_value``; None (with a warning) when it cannot be: the run itself
    finished, and its checkpoints and metrics are committed."""
    if value is None:
        return None
    from ray import cloudpickle

    try:
        return cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure
        logging.getLogger("trainlib").warning(
            "The training function returned a %s, which cannot be pickled (%s: %s): Result.return_value is None. "
            "Return a picklable value, e.g. plain numbers, lists, dicts or a model's state_dict().",
            type(value).__name__,
            type(exc).__name__,
            exc,
        )
        return None


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
