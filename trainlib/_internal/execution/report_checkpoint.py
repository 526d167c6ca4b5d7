"""How ``report()`` places a checkpoint's files for run storage. Runs in worker actors only (and in local mode).

SYNC copies the folder straight into run storage when the storage is local (or stages a local copy first when it
is remote), ASYNC leaves the copy to the uploader thread (``report_uploader.py``), NO_UPLOAD and a
``checkpoint_upload_fn`` adopt a folder already in the run's folder. The session (``session.py``) numbers the
reports; this module decides where each checkpoint's files go and checks that they arrived as reported.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import shutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainlib._internal.execution import staging
from trainlib._internal.execution.messages import CheckpointPlacement
from trainlib._internal.storage.checkpoint_files import checkpoint_files
from trainlib._internal.storage.commits import checkpoint_dir_name
from trainlib.checkpoint import Checkpoint
from trainlib.reporting import CheckpointUploadMode

if TYPE_CHECKING:
    from trainlib._internal.storage.run_storage import RunStorage


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    """The checkpoint options of one ``report()`` call (Ray Train's keyword arguments)."""

    dir_name: str | None = None
    upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC
    delete_local: bool | None = None
    upload_fn: Callable[[Checkpoint, str], Checkpoint] | None = None


@dataclasses.dataclass
class PendingReport:
    """One report on its way from ``report()`` through the uploader thread to the driver."""

    step: int
    metrics: dict[str, Any]
    staged_dir: str | None  # a local copy still to upload (remote storage)
    manifest: dict[str, int] | None  # files already in storage (local storage)
    reported_at: float
    placement: CheckpointPlacement | None = None
    upload: Callable[[], dict[str, int]] | None = None  # an ASYNC upload, run by the uploader thread


class CheckpointPlacer:
    """Places each reported checkpoint of one worker's session: copied, staged, scheduled or adopted."""

    def __init__(self, storage: RunStorage, staging_root: str | None):
        self.storage = storage
        self.staging_root = staging_root  # remote storage only: where SYNC checkpoints are staged
        self._dir_names: set[str] = set()  # the checkpoint_dir_names this rank copied into

    def place(self, pending: PendingReport, checkpoint: Checkpoint, options: ReportOptions) -> None:
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
            pending.staged_dir = os.path.join(self.staging_root, f"step_{pending.step}")
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
