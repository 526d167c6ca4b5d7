"""Content hashes of a source's files, cached by path, size and version (mtime or ETag). Runs on the driver.

Re-listing a large source then reads no file that has not changed: one SQLite file per cache
folder, keyed by the file's URL, with its size and version; a rewritten file (new size or
version) is hashed again. Files of a remote source are kept in the node's blob cache
(:mod:`tasks.domain.blob_cache`) as they are hashed, so the node does not fetch them twice.

Example::

    cache = HashCache("~/.trainlib/datasets")
    hashes = cache.hash_files(lambda f: fs.cat_file(f.path), files, keep_blobs=True)
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from tasks.domain.blob_cache import BlobCache
from tasks.domain.urls import expand_path

logger = logging.getLogger("trainlib")

DB_FILE = "hash_cache.sqlite"
HASH_THREADS = 16  # hashing is I/O-bound (remote reads) or in hashlib, which releases the GIL on large reads


@dataclasses.dataclass(frozen=True)
class FileToHash:
    """A file to identify: ``url`` (the cache's key), ``path`` on its filesystem, ``size`` and ``version``."""

    url: str
    path: str
    size: int
    version: str


@dataclasses.dataclass(frozen=True)
class HashStats:
    """How a hashing pass went: files found in the cache and files read."""

    cached: int
    hashed: int


class HashCache:
    """sha256 of files keyed by (url, size, version), in ``<folder>/hash_cache.sqlite``."""

    def __init__(self, folder: str):
        self.folder = expand_path(folder)
        os.makedirs(self.folder, exist_ok=True)
        self.db_path = os.path.join(self.folder, DB_FILE)
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS hashes (url TEXT PRIMARY KEY, size INTEGER, version TEXT, sha256 TEXT)"
            )
        self.blobs = BlobCache(self.folder)
        self.stats = HashStats(0, 0)

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.db_path, timeout=60)
        db.execute("PRAGMA journal_mode=WAL")
        return db

    def hash_files(
        self, read: Callable[[FileToHash], bytes], files: Sequence[FileToHash], keep_blobs: bool = False
    ) -> dict[str, str]:
        """url -> sha256 of every file; reads (with ``read``) only those the cache does not know at their size and
        version.

        ``keep_blobs``: store each file read in the blob cache (a remote source, so workers here fetch nothing).
        """
        wanted = {f.url for f in files}
        low, high = (min(wanted), max(wanted)) if wanted else ("", "")
        with self._connect() as db:  # the key range of these files only (one index scan)
            rows = db.execute(
                "SELECT url, size, version, sha256 FROM hashes WHERE url >= ? AND url <= ?", (low, high)
            ).fetchall()
        known = {url: (size, version, sha) for url, size, version, sha in rows if url in wanted}
        hashes: dict[str, str] = {}
        to_read: list[FileToHash] = []
        for f in files:
            hit = known.get(f.url)
            if hit and hit[0] == f.size and hit[1] == f.version and f.version:
                hashes[f.url] = hit[2]
            else:
                to_read.append(f)

        def read_one(f: FileToHash) -> tuple[str, str]:
            data = read(f)
            sha = hashlib.sha256(data).hexdigest()
            if keep_blobs:
                self.blobs.put(sha, data)
            return f.url, sha

        with ThreadPoolExecutor(HASH_THREADS) as pool:
            fresh = dict(pool.map(read_one, to_read))
        hashes.update(fresh)
        if fresh:
            by_url = {f.url: f for f in to_read}
            with self._connect() as db:
                db.executemany(
                    "INSERT OR REPLACE INTO hashes (url, size, version, sha256) VALUES (?, ?, ?, ?)",
                    [(url, by_url[url].size, by_url[url].version, sha) for url, sha in fresh.items()],
                )
        self.stats = HashStats(cached=len(files) - len(to_read), hashed=len(to_read))
        logger.info("Hashed %d file(s); %d came from the hash cache %s", len(to_read), self.stats.cached, self.db_path)
        return hashes
