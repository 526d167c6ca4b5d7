"""A node's content-addressed copy of remote image files: ``<cache>/blobs/<sha[:2]>/<sha>``. Runs on any node.

A file of a remote source (S3 or any fsspec URL) is fetched once per node and kept under its
sha256; a local source's files are read where they are. Writes are atomic (temporary name,
then rename), so workers of one node that fetch the same file at once never see half a file.

Example::

    blobs = BlobCache("/local/cache")
    data = blobs.read_or_fetch(sha, lambda: fs.cat_file(path))
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable

from tasks.domain.urls import expand_path


class BlobCache:
    """Files by sha256 under ``<folder>/blobs``."""

    def __init__(self, folder: str):
        self.root = os.path.join(expand_path(folder), "blobs")

    def path(self, sha256: str) -> str:
        return os.path.join(self.root, sha256[:2], sha256)

    def get(self, sha256: str) -> bytes | None:
        """The blob's bytes, or None when this node does not have it."""
        try:
            with open(self.path(sha256), "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def put(self, sha256: str, data: bytes) -> None:
        dest = self.path(sha256)
        if os.path.exists(dest):
            return
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        tmp = f"{dest}.{uuid.uuid4().hex}.part"
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, dest)

    def read_or_fetch(self, sha256: str, fetch: Callable[[], bytes]) -> bytes:
        """The blob, fetched once with ``fetch`` when missing and checked against ``sha256``.

        Raises:
            ValueError: the fetched content has another hash (the file changed since the snapshot).
        """
        data = self.get(sha256)
        if data is not None:
            return data
        data = fetch()
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            raise ValueError(f"content changed since the snapshot: sha256 {actual}, the snapshot has {sha256}")
        self.put(sha256, data)
        return data
