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


# Query parameters of a storage URL that hold secrets: used to open the filesystem, never put back into a URL.
_SECRET_QUERY_KEYS = frozenset({"access_key", "secret_key", "session_token"})


def as_fsspec(filesystem: Any) -> fsspec.AbstractFileSystem:
    """``filesystem`` as an fsspec filesystem: fsspec ones as they are, ``pyarrow.fs`` ones wrapped (a
    ``PyFileSystem(FSSpecHandler(fs))`` unwrapped to its ``fs``)."""
    if isinstance(filesystem, fsspec.AbstractFileSystem):
        return filesystem
    try:
        import pyarrow.fs as pafs
    except ImportError:  # pragma: no cover - pyarrow comes with ray[data]
        pafs = None
    if pafs is not None and isinstance(filesystem, pafs.FileSystem):
        if isinstance(filesystem, pafs.LocalFileSystem):
            return fsspec.filesystem("file")  # the same disk: keep trainlib's local fast paths
        if isinstance(filesystem, pafs.PyFileSystem) and isinstance(filesystem.handler, pafs.FSSpecHandler):
            return filesystem.handler.fs  # fsspec under pyarrow: use it directly (its URLs, its retries)
        from fsspec.implementations.arrow import ArrowFSWrapper

        return ArrowFSWrapper(filesystem)
    raise TypeError(
        f"RunConfig.storage_filesystem must be an fsspec filesystem or a pyarrow.fs.FileSystem, got "
        f"{type(filesystem).__name__}: e.g. s3fs.S3FileSystem(...) or pyarrow.fs.S3FileSystem(...)."
    )


def as_pyarrow(fs: fsspec.AbstractFileSystem) -> Any:
    """The ``pyarrow.fs.FileSystem`` that Ray Train's ``Result.filesystem`` and ``Checkpoint.filesystem`` give for
    trainlib's fsspec ``fs``: a wrapped pyarrow filesystem unwrapped, the local disk as ``LocalFileSystem``, any other
    fsspec filesystem as ``PyFileSystem(FSSpecHandler(fs))``."""
    import pyarrow.fs as pafs
    from fsspec.implementations.arrow import ArrowFSWrapper

    if isinstance(fs, ArrowFSWrapper):
        return fs.fs
    if is_local_filesystem(fs):
        return pafs.LocalFileSystem()
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def _from_query_url(path: str, storage_options: dict | None, field: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """A storage URL with query parameters (``s3://bucket/path?endpoint_override=...``), opened as Ray Train opens
    it: by ``pyarrow.fs.FileSystem.from_uri``, which reads the parameters. The URL's non-secret parameters stay on the
    filesystem, so that the URLs trainlib gives back (``Result.uri``, ``Checkpoint.uri``) reach the same store."""
    import urllib.parse

    import pyarrow
    import pyarrow.fs as pafs

    if storage_options:
        raise StorageError(
            f"{field}={_without_secrets(path)!r} has query parameters and RunConfig.storage_options is set too: "
            "give the store's options one way, in the URL (as in Ray Train) or in storage_options."
        )
    try:
        filesystem, inner = pafs.FileSystem.from_uri(path)
    except (pyarrow.ArrowInvalid, ValueError, OSError) as exc:
        raise StorageError(
            f"{field}={_without_secrets(path)!r} cannot be opened: {exc}. The query parameters are pyarrow's "
            "(for S3: region, scheme, endpoint_override, ...), e.g. 's3://bucket/runs?endpoint_override="
            "http://127.0.0.1:9000'."
        ) from None
    parts = urllib.parse.urlsplit(path)
    return _QueryArrowFS(filesystem, scheme=parts.scheme, query=_public_query(parts.query)), inner


def _public_query(query: str) -> str:
    import urllib.parse

    pairs = urllib.parse.parse_qsl(query, keep_blank_values=True)
    return urllib.parse.urlencode([(k, v) for k, v in pairs if k not in _SECRET_QUERY_KEYS], safe=":/")


def _without_secrets(url: str) -> str:
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(query=_public_query(parts.query)))


def _arrow_wrapper() -> type:
    from fsspec.implementations.arrow import ArrowFSWrapper

    return ArrowFSWrapper


class _QueryArrowFS(_arrow_wrapper()):  # type: ignore[misc]
    """A pyarrow filesystem opened from a URL with query parameters, which its URLs carry again."""

    def __init__(self, fs: Any, scheme: str = "", query: str = "", **kwargs: Any):
        super().__init__(fs, **kwargs)
        self.url_scheme = scheme
        self.url_query = query

    def unstrip_protocol(self, name: str) -> str:
        url = f"{self.url_scheme}://{name.lstrip('/')}"
        return f"{url}?{self.url_query}" if self.url_query else url


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
    if "://" in path and "?" in path:
        return _from_query_url(path, storage_options, field)
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
