"""fsspec filesystem resolution: a storage path or URL -> (filesystem, path). Driver and workers."""

from __future__ import annotations

import os
from typing import Any

import fsspec

from trainlib._internal.util.paths import expand_path
from trainlib.errors import StorageError

DEFAULT_STORAGE_PATH = "~/trainlib_results"


def is_local_filesystem(fs: fsspec.AbstractFileSystem) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def as_fsspec(filesystem: Any) -> fsspec.AbstractFileSystem:
    """``filesystem`` as an fsspec filesystem: fsspec ones as they are, ``pyarrow.fs`` ones wrapped."""
    if isinstance(filesystem, fsspec.AbstractFileSystem):
        return filesystem
    try:
        import pyarrow.fs as pafs
    except ImportError:  # pragma: no cover - pyarrow comes with ray[data]
        pafs = None
    if pafs is not None and isinstance(filesystem, pafs.FileSystem):
        if isinstance(filesystem, pafs.LocalFileSystem):
            return fsspec.filesystem("file")  # the same disk: keep trainlib's local fast paths
        from fsspec.implementations.arrow import ArrowFSWrapper

        return ArrowFSWrapper(filesystem)
    raise TypeError(
        f"RunConfig.storage_filesystem must be an fsspec filesystem or a pyarrow.fs.FileSystem, got "
        f"{type(filesystem).__name__}: e.g. s3fs.S3FileSystem(...) or pyarrow.fs.S3FileSystem(...)."
    )


def resolve_filesystem(
    storage_path: str | os.PathLike | None,
    filesystem: Any = None,
    storage_options: dict | None = None,
    *,
    field: str = "RunConfig.storage_path",
) -> tuple[fsspec.AbstractFileSystem, str]:
    """Return the fsspec filesystem and the path inside it for a local path or an fsspec URL.

    ``field`` names the argument in the error raised when the URL cannot be opened.
    """
    path = os.fspath(storage_path) if storage_path is not None else DEFAULT_STORAGE_PATH
    if filesystem is not None:
        fs = as_fsspec(filesystem)
        if "://" in path and not isinstance(filesystem, fsspec.AbstractFileSystem):
            path = path.split("://", 1)[1]  # pyarrow filesystems take paths without the scheme
        elif "://" not in path and is_local_filesystem(fs):
            path = expand_path(path)
        return fs, fs._strip_protocol(path)
    path = expand_path(path)
    try:
        fs, inner = fsspec.core.url_to_fs(path, **(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise StorageError(
            f"{field}={path!r} cannot be opened: {exc}. Use a local folder or an "
            "fsspec URL whose package is installed (s3:// needs s3fs)."
        ) from None
    return fs, inner


def declares_shared(storage_path: str | os.PathLike | None) -> bool:
    """Whether a local ``storage_path`` is declared shared by every node: written as a ``file://`` URL.

    A plain path (``/data/runs``) is taken as one machine's disk; ``file:///mnt/nfs/runs``
    says "this path is the same storage on every node" (an NFS or other shared mount).
    """
    return storage_path is not None and os.fspath(storage_path).startswith("file://")


def to_uri(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """The URL of ``path`` on ``fs`` for people and ``Checkpoint.from_uri``: a plain path on local disk."""
    return path if is_local_filesystem(fs) else fs.unstrip_protocol(path)
