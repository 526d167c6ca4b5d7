"""Reading a snapshot's files on any node: local files where they are, remote ones once per node. Runs anywhere.

Every read is checked against the entry's sha256, so a run reads exactly its snapshot's bytes (a
file rewritten since fails with its path). Remote files go through the node's blob cache
(:mod:`tasks.domain.blob_cache`): fetched once per node, then read locally.

Example::

    reader = SnapshotReader(snapshot, cache_dir="/local/cache")
    blobs = reader.read_many(snapshot.split("test"))
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tasks.domain.blob_cache import BlobCache
from tasks.domain.data_source import open_fs
from tasks.domain.snapshot import Snapshot, SnapshotEntry
from tasks.domain.urls import mask_url

READ_THREADS = 16


class SnapshotFileError(OSError):
    """A snapshot's file is missing or changed since the snapshot; the message names it."""


class SnapshotReader:
    """Reads the files of ``snapshot`` (hash-checked); remote ones cached under ``cache_dir``."""

    def __init__(self, snapshot: Snapshot, cache_dir: str, storage_options: Mapping[str, Any] | None = None):
        self.snapshot = snapshot
        self.blobs = BlobCache(cache_dir)
        self.storage_options = dict(storage_options or {})
        self._fs = {}

    def _fs_of(self, url: str) -> tuple[Any, str]:
        scheme = url.split("://", 1)[0] if "://" in url else "file"
        if scheme not in self._fs:
            self._fs[scheme] = open_fs(url, self.storage_options)[0]
        fs = self._fs[scheme]
        return fs, fs._strip_protocol(url)

    def read(self, entry: SnapshotEntry) -> bytes:
        """The bytes of ``entry``'s file.

        Raises:
            SnapshotFileError: the file is gone or its content is not the snapshot's.
        """
        url = self.snapshot.url(entry)
        fs, path = self._fs_of(url)
        try:
            if "://" not in url:
                data = fs.cat_file(path)
                if hashlib.sha256(data).hexdigest() != entry.sha256:
                    raise ValueError("content changed since the snapshot")
                return data
            return self.blobs.read_or_fetch(entry.sha256, lambda: fs.cat_file(path))
        except (OSError, ValueError) as exc:
            raise SnapshotFileError(
                f"{mask_url(url)} of snapshot {self.snapshot.digest[:12]} cannot be read as it was listed: "
                f"{type(exc).__name__}: {exc}. Sources are append-only: restore the file, or start a new run "
                "(it takes a new snapshot)."
            ) from None

    def read_many(self, entries: Sequence[SnapshotEntry]) -> list[bytes]:
        """The bytes of every entry, in order (read concurrently)."""
        with ThreadPoolExecutor(READ_THREADS) as pool:
            return list(pool.map(self.read, entries))
