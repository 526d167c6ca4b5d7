"""Run storage on fsspec: the run folder, atomic checkpoint commits, the metrics log. Driver and workers.

Used on the driver (commit, retention, run state) and in worker actors
(checkpoint upload). Layout of one run::

    <storage_path>/<name>/
        trainlib_run.json          run config and status, rewritten atomically
        metrics.jsonl              every report: step, time, attempt, checkpoint, metrics
        checkpoint_000003/
            model.pt ...           files written by the workers
            .trainlib_commit.json  the commit marker, written last: step, metrics, manifest

A checkpoint is valid only when its marker exists and every file in the
marker's manifest has the recorded size. Files are written under a temporary
name and renamed (local) or put as one object (S3), so no file is ever half
visible; the marker is written last, so a crash at any moment leaves either the
previous checkpoints or the new complete one.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import time
from typing import Any

import fsspec

from trainlib._internal import metrics as metric_values
from trainlib._internal.storage.checkpoint_files import checkpoint_files
from trainlib._internal.storage.commits import (
    CHECKPOINT_PREFIX,
    COMMIT_MARKER,
    CommittedCheckpoint,
    checkpoint_dir_name,
)
from trainlib._internal.storage.lease_record import LEASE_PREFIX
from trainlib._internal.storage.run_record import RUN_STATE_FILE
from trainlib._internal.util.atomic import atomic_copy, atomic_write
from trainlib._internal.util.filesystem import (
    declares_shared,
    is_local_filesystem,
    resolve_filesystem,
    to_uri,
)
from trainlib._internal.util.retry import with_retries

logger = logging.getLogger("trainlib")

METRICS_FILE = "metrics.jsonl"


class RunStorage:
    """The folder of one run on an fsspec filesystem. Picklable; sent to workers.

    ``shared``: whether every node sees this storage. Remote filesystems are; a local
    folder is only when declared so (see :func:`declares_shared`).
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, name: str, shared: bool = False):
        self.fs = fs
        self.root = root.rstrip("/")
        self.name = name
        self.run_path = posixpath.join(self.root, name)
        self.is_local = is_local_filesystem(fs)
        self.shared = shared or not self.is_local

    @classmethod
    def open_existing(
        cls, path: str | os.PathLike, filesystem: Any = None, storage_options: dict | None = None, caller: str = "open"
    ) -> RunStorage:
        """The run folder at ``path`` (``<storage_path>/<name>``); FileNotFoundError when no run is there."""
        fs, inner = resolve_filesystem(path, filesystem, storage_options)
        root, name = inner.rstrip("/").rsplit("/", 1)
        storage = cls(fs, root, name, shared=declares_shared(path))
        if not storage.exists():
            raise FileNotFoundError(
                f"{caller}({os.fspath(path)!r}): no trainlib run there (no {RUN_STATE_FILE}). Pass the run's "
                "folder: <storage_path>/<name>."
            )
        return storage

    def uri(self, path: str | None = None) -> str:
        """The URL of ``path`` (default: the run folder), for people to read."""
        return to_uri(self.fs, path or self.run_path)

    def join(self, *parts: str) -> str:
        return posixpath.join(self.run_path, *parts)

    def checkpoint_path(self, step: int, dir_name: str | None = None) -> str:
        """The folder of the checkpoint of ``step``: ``checkpoint_<step>``, or the ``checkpoint_dir_name`` given."""
        return self.join(dir_name or checkpoint_dir_name(step))

    # -- writing -----------------------------------------------------------------

    def write_bytes_atomic(self, path: str, data: bytes) -> None:
        """Write a whole file so that readers see the old or the new content, never a part."""

        def write() -> None:
            if self.is_local:
                atomic_write(path, data)
            else:
                try:
                    self.fs.pipe_file(path, data)  # one PUT: atomic on object stores
                except FileNotFoundError:
                    # A wrapped pyarrow filesystem has real folders: make them. On an object store the
                    # error means a missing bucket, which is the user's to create (never created here).
                    if type(self.fs).__name__ != "ArrowFSWrapper":
                        raise
                    self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
                    self.fs.pipe_file(path, data)

        with_retries(f"writing {self.uri(path)}", write)

    def write_json_atomic(self, path: str, obj: Any) -> None:
        self.write_bytes_atomic(path, json.dumps(obj, indent=1, default=str).encode())

    def upload_directory(self, local_dir: str, dest: str) -> dict[str, int]:
        """Copy every file under ``local_dir`` into ``dest``; return the manifest {relpath: size}.

        Symlinks are checked first (see :mod:`checkpoint_files`): none is followed out of the folder.
        """
        manifest: dict[str, int] = {}
        for item in checkpoint_files(local_dir):
            manifest[item.rel] = item.size
            self._upload_file(item.local_path, posixpath.join(dest, item.rel))
        return manifest

    def _upload_file(self, local_file: str, dest: str) -> None:
        def copy() -> None:
            if self.is_local:
                atomic_copy(local_file, dest)
            else:
                self.fs.put_file(local_file, dest)

        with_retries(f"uploading {os.path.basename(local_file)} to {self.uri(dest)}", copy)

    def list_files(self, path: str) -> dict[str, int]:
        """The manifest {relpath: size} of the files under ``path`` in storage (the commit marker left out)."""

        def ls() -> dict[str, int]:
            self.fs.invalidate_cache(path)
            found = self.fs.find(path, detail=True)
            return {
                posixpath.relpath(name, path): int(info["size"])
                for name, info in found.items()
                if posixpath.basename(name) != COMMIT_MARKER
            }

        return with_retries(f"listing {self.uri(path)}", ls)

    def commit_checkpoint(
        self, step: int, metrics: dict[str, Any], manifest: dict[str, int], dir_name: str | None = None
    ) -> CommittedCheckpoint:
        """Write the commit marker of the checkpoint of ``step``: from now on it is valid."""
        path = self.checkpoint_path(step, dir_name)
        now = time.time()
        marker = {"step": step, "metrics": metrics, "files": manifest, "committed_at": now}
        self.write_bytes_atomic(posixpath.join(path, COMMIT_MARKER), metric_values.dumps(marker, indent=1).encode())
        return CommittedCheckpoint(step=step, path=path, metrics=metrics, committed_at=now)

    def holds_commit(self, path: str) -> bool:
        """Whether the folder ``path`` holds a commit marker: a committed checkpoint is there."""
        marker = posixpath.join(path, COMMIT_MARKER)

        def exists() -> bool:
            self.fs.invalidate_cache(path)
            return self.fs.exists(marker)

        return with_retries(f"reading {self.uri(marker)}", exists)

    def delete_checkpoint(self, path: str) -> None:
        """Delete a checkpoint: marker first, so a crash mid-delete never leaves a valid-looking part."""
        marker = posixpath.join(path, COMMIT_MARKER)
        with_retries(f"deleting {self.uri(path)}", lambda: self.fs.exists(marker) and self.fs.rm(marker))
        with_retries(f"deleting {self.uri(path)}", lambda: self.fs.exists(path) and self.fs.rm(path, recursive=True))

    def append_metrics_row(self, row: dict[str, Any], all_rows: list[dict[str, Any]]) -> None:
        """Add ``row`` to the metrics log (append locally; object stores get the whole log rewritten)."""
        path = self.join(METRICS_FILE)
        line = (metric_values.dumps(row) + "\n").encode()
        if self.is_local:

            def append() -> None:
                os.makedirs(self.run_path, exist_ok=True)
                # One write() of the whole line on an O_APPEND file, then fsync: a crash leaves
                # whole lines, or at worst a torn last one, which readers skip and resume repairs.
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    if os.write(fd, line) != len(line):
                        raise OSError(f"short write to {path}")
                    os.fsync(fd)
                finally:
                    os.close(fd)

            with_retries(f"appending to {self.uri(path)}", append)
        else:
            self.write_bytes_atomic(path, "".join(metric_values.dumps(r) + "\n" for r in all_rows).encode())

    # -- reading -----------------------------------------------------------------

    def exists(self) -> bool:
        return with_retries(f"reading {self.uri()}", lambda: self.fs.exists(self.join(RUN_STATE_FILE)))

    def read_json(self, path: str) -> Any:
        return json.loads(with_retries(f"reading {self.uri(path)}", lambda: self.fs.cat_file(path)))

    def list_checkpoint_dirs(self) -> list[str]:
        """Folders named ``checkpoint_*`` (committed or not), and folders of another name that hold a
        commit marker (a ``checkpoint_dir_name`` given to ``report``)."""

        def ls() -> list[str]:
            self.fs.invalidate_cache(self.run_path)
            if not self.fs.exists(self.run_path):
                return []
            folders = [
                e["name"].rstrip("/") for e in self.fs.ls(self.run_path, detail=True) if e.get("type") == "directory"
            ]
            return [
                f
                for f in folders
                if posixpath.basename(f).startswith(CHECKPOINT_PREFIX)
                or self.fs.exists(posixpath.join(f, COMMIT_MARKER))
            ]

        return sorted(with_retries(f"listing {self.uri()}", ls))

    def verify_checkpoint(self, path: str) -> CommittedCheckpoint | None:
        """The checkpoint at ``path`` if its marker exists and its files are complete, else None."""
        return with_retries(f"reading {self.uri(path)}", lambda: self._verify_checkpoint(path.rstrip("/")))

    def _verify_checkpoint(self, path: str) -> CommittedCheckpoint | None:
        marker_path = posixpath.join(path, COMMIT_MARKER)
        try:
            self.fs.invalidate_cache(path)
            marker = metric_values.loads(self.fs.cat_file(marker_path))
            for rel, size in marker["files"].items():
                if self.fs.size(posixpath.join(path, rel)) != size:
                    return None
            return CommittedCheckpoint(
                step=int(marker["step"]),
                path=path,
                metrics=marker.get("metrics", {}),
                committed_at=float(marker.get("committed_at", 0)),
            )
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            logger.warning("Ignoring checkpoint %s: its commit marker is unreadable", self.uri(path))
            return None

    def committed_checkpoints(self) -> list[CommittedCheckpoint]:
        """Every valid checkpoint of the run, oldest first."""
        found = (self.verify_checkpoint(p) for p in self.list_checkpoint_dirs())
        return sorted((c for c in found if c is not None), key=lambda c: c.step)

    def remove_uncommitted(self) -> list[str]:
        """Delete checkpoint folders without a valid marker (left by a crash); return their paths."""
        removed = []
        for path in self.list_checkpoint_dirs():
            if self.verify_checkpoint(path) is None:
                with_retries(f"deleting {self.uri(path)}", lambda p=path: self.fs.rm(p, recursive=True))
                removed.append(path)
        return removed

    def read_metrics_log(self) -> list[dict[str, Any]]:
        """Every row of the metrics log. A torn last line (a crash mid-append) is skipped with a warning."""
        path = self.join(METRICS_FILE)
        try:
            text = with_retries(f"reading {self.uri(path)}", lambda: self.fs.cat_file(path)).decode(errors="replace")
        except FileNotFoundError:
            return []
        rows = []
        lines = text.splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rows.append(metric_values.loads(line))
            except ValueError:
                where = (
                    "its last line is torn (a crash mid-append)"
                    if number == len(lines)
                    else f"line {number} is unreadable"
                )
                logger.warning("Skipping a line of %s: %s: %r", self.uri(path), where, line[:80])
        return rows

    def repair_metrics_log(self, rows: list[dict[str, Any]]) -> None:
        """Before appending to a log that a crash may have torn: rewrite it as whole lines of ``rows``."""
        path = self.join(METRICS_FILE)
        try:
            data = with_retries(f"reading {self.uri(path)}", lambda: self.fs.cat_file(path))
        except FileNotFoundError:
            return
        lines = [line for line in data.split(b"\n") if line.strip()]
        if data and (not data.endswith(b"\n") or len(lines) != len(rows)):
            whole = "".join(metric_values.dumps(r) + "\n" for r in rows).encode()
            logger.warning("Rewriting %s without its torn or unreadable lines", self.uri(path))
            self.write_bytes_atomic(path, whole)

    def remove_run(self) -> None:
        """Delete the run's files; its lease files stay, for the driver that holds the lease."""

        def rm() -> None:
            self.fs.invalidate_cache(self.run_path)
            if not self.fs.exists(self.run_path):
                return
            for entry in self.fs.ls(self.run_path, detail=False):
                if not posixpath.basename(entry.rstrip("/")).startswith(LEASE_PREFIX):
                    self.fs.rm(entry, recursive=True)

        with_retries(f"deleting {self.uri()}", rm)
