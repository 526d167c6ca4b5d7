"""``Checkpoint``: a folder of files on some filesystem. Used on the driver and in workers."""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import fsspec

from trainlib._internal.storage.commits import COMMIT_MARKER
from trainlib._internal.util.filesystem import as_fsspec, as_pyarrow, is_local_filesystem, resolve_filesystem, to_uri
from trainlib._internal.util.retry import with_retries

# As Ray Train's: the checkpoint's metadata, a JSON file beside its files.
METADATA_FILE = ".metadata.json"


class Checkpoint:
    """A folder of checkpoint files, local or in run storage.

    In a worker, make one from a local folder and pass it to ``trainlib.report``;
    the driver hands committed ones back through ``Result.checkpoint`` and
    ``trainlib.get_checkpoint()``.

    Args:
        path: the folder, as a path inside ``filesystem`` (no scheme: ``bucket/runs/run/checkpoint_000001``).
        filesystem: a ``pyarrow.fs.FileSystem`` (as in Ray Train) or an fsspec filesystem; ``None`` means the
            local disk.

    Attributes:
        path: the folder, as a path inside :attr:`filesystem`, as Ray Train gives it.
        filesystem: the ``pyarrow.fs.FileSystem`` to read ``path`` with, as Ray Train gives it.
        uri: the folder as one URL (``Checkpoint.from_uri`` reads it back).

    Example:
        >>> with result.checkpoint.as_directory() as folder:
        ...     state = torch.load(os.path.join(folder, "model.pt"))
    """

    def __init__(self, path: str | os.PathLike, filesystem: Any = None):
        # trainlib reads and writes through fsspec; the pyarrow filesystem is made when asked for (or kept as given).
        self._fs = as_fsspec(filesystem) if filesystem is not None else fsspec.filesystem("file")
        self._pyarrow_fs = None if filesystem is None or filesystem is self._fs else filesystem
        self.path = os.fspath(path)

    @property
    def filesystem(self) -> Any:
        """The ``pyarrow.fs.FileSystem`` that holds :attr:`path` (Ray Train's ``Checkpoint.filesystem``)."""
        if self._pyarrow_fs is None:
            self._pyarrow_fs = as_pyarrow(self._fs)
        return self._pyarrow_fs

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "filesystem" in state:  # pickled before the pyarrow filesystem: it held the fsspec one
            state["_fs"] = state.pop("filesystem")
        state.setdefault("_pyarrow_fs", None)
        self.__dict__.update(state)

    @classmethod
    def from_directory(cls, path: str | os.PathLike) -> Checkpoint:
        """A checkpoint of the local folder ``path`` (as in a worker before ``report``)."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise ValueError(
                f"Checkpoint.from_directory({path!r}): no such folder. Save the checkpoint files into a "
                "folder first, then pass that folder."
            )
        return cls(os.path.abspath(path))

    @classmethod
    def from_uri(cls, uri: str, storage_options: dict | None = None) -> Checkpoint:
        """The checkpoint at ``uri``, as :attr:`uri` gives it: a local path or an fsspec URL (``s3://...``)."""
        filesystem, path = resolve_filesystem(uri, storage_options=storage_options, field="Checkpoint.from_uri(uri)")
        return cls(path, filesystem)

    @property
    def is_local(self) -> bool:
        return is_local_filesystem(self._fs)

    @property
    def uri(self) -> str:
        """The checkpoint's URL (a plain path on local disk)."""
        return to_uri(self._fs, self.path)

    def to_directory(self, path: str | os.PathLike | None = None) -> str:
        """Copy the checkpoint's files into local folder ``path`` (a new temp folder by default)."""
        dest = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="trainlib_checkpoint_")
        os.makedirs(dest, exist_ok=True)
        if self.is_local:
            shutil.copytree(self.path, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(COMMIT_MARKER))
        else:
            src = self.path.rstrip("/") + "/"
            with_retries(f"downloading {self.uri}", lambda: self._fs.get(src, dest + "/", recursive=True))
            marker = os.path.join(dest, COMMIT_MARKER)
            if os.path.exists(marker):
                os.remove(marker)
        return dest

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local folder with the checkpoint's files, for the duration of the ``with`` block.

        Local checkpoints are read in place (treat the folder as read-only); the folder
        then also holds trainlib's commit marker, ``.trainlib_commit.json``, which
        ``to_directory()`` leaves out. Remote ones are downloaded to a temporary folder,
        without the marker, deleted afterwards.
        """
        if self.is_local:
            yield self.path
            return
        dest = self.to_directory()
        try:
            yield dest
        finally:
            shutil.rmtree(dest, ignore_errors=True)

    def get_metadata(self) -> dict[str, Any]:
        """The metadata dict stored with the checkpoint (``{}`` when none): yours, and the trainer's ``metadata``."""
        path = posixpath.join(self.path, METADATA_FILE)
        if not with_retries(f"reading {self.uri}", lambda: self._fs.exists(path)):
            return {}
        return json.loads(with_retries(f"reading {self.uri}", lambda: self._fs.cat_file(path)))

    def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Store ``metadata`` (a JSON-able dict) with the checkpoint, replacing what was there."""
        if not isinstance(metadata, dict):
            raise TypeError(f"Checkpoint.set_metadata() takes a dict, got {type(metadata).__name__}.")
        data = json.dumps(metadata).encode()
        path = posixpath.join(self.path, METADATA_FILE)
        with_retries(f"writing {self.uri}", lambda: self._fs.pipe_file(path, data))

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Add ``metadata``'s keys to the checkpoint's metadata (overwriting the same keys)."""
        self.set_metadata({**self.get_metadata(), **metadata})

    def __repr__(self) -> str:
        return f"Checkpoint(path={self.uri!r})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Checkpoint) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)
