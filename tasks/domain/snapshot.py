"""Snapshots: a data version, the listed files of a source identified by content. Runs on the driver and workers.

A run lists its source once (:func:`take_snapshot`), writes the snapshot to run storage
(:func:`write_snapshot`, Parquet) and from then on refers to it only: the workers read the
files it names and check their hashes, so files that arrive later never reach that run. The
snapshot's :attr:`Snapshot.digest` is the data version (MLflow ``log_input``, the model
version's ``data.digest`` tag). Images whose source gives no split get one from their content
hash, so an image stays in the same split in every snapshot and the test set is fixed by content.

Example::

    snapshot = take_snapshot("s3://bucket/pets", cache_dir="~/.trainlib/datasets")
    snapshot.digest, snapshot.counts()["cat"]["train"]
    write_snapshot(snapshot, "s3://bucket/runs/snapshots/pets-1.parquet")
    read_snapshot("s3://bucket/runs/snapshots/pets-1.parquet") == snapshot
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import json
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from tasks.domain.data_source import SPLITS, list_source, open_fs, resolve
from tasks.domain.hash_cache import FileToHash, HashCache
from tasks.domain.urls import expand_path, mask_url

logger = logging.getLogger("trainlib")

TEST_FRACTION = 0.2  # share of the images of a source without splits that go to the test split, by content hash
COLUMNS = ("path", "label", "split", "batch", "sha256", "size")
METADATA_KEY = b"trainlib.snapshot"


@dataclasses.dataclass(frozen=True)
class SnapshotEntry:
    """One image of a snapshot.

    Attributes:
        path: relative to the snapshot's root, or a URL (a manifest's).
        label: its class name.
        split: ``"train"`` or ``"test"``.
        sha256: its content hash.
        size: bytes.
        batch: the arrival batch's folder, ``""`` when the source has no batches.
    """

    path: str
    label: str
    split: str
    sha256: str
    size: int
    batch: str = ""


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The listed files of ``source`` at one moment; ``root`` is where relative paths start (default: ``source``)."""

    source: str
    entries: tuple[SnapshotEntry, ...]
    root: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", tuple(self.entries))
        if not self.root:
            object.__setattr__(self, "root", self.source.rstrip("/"))

    @functools.cached_property
    def digest(self) -> str:
        """sha256 over the sorted (path, label, split, sha256) rows: the data version."""
        rows = sorted(f"{e.path}\t{e.label}\t{e.split}\t{e.sha256}\n" for e in self.entries)
        return hashlib.sha256("".join(rows).encode()).hexdigest()

    @functools.cached_property
    def hashes(self) -> frozenset[str]:
        """The content hashes of every entry."""
        return frozenset(e.sha256 for e in self.entries)

    @property
    def class_names(self) -> tuple[str, ...]:
        """The labels, sorted: label index i is ``class_names[i]``."""
        return tuple(sorted({e.label for e in self.entries}))

    def counts(self) -> dict[str, dict[str, int]]:
        """label -> split -> number of images (every split present for every label, zeros included)."""
        out = {label: dict.fromkeys(SPLITS, 0) for label in self.class_names}
        for e in self.entries:
            out[e.label][e.split] += 1
        return out

    def split(self, name: str) -> tuple[SnapshotEntry, ...]:
        """The entries of split ``name`` (``"train"`` or ``"test"``), in snapshot order."""
        return tuple(e for e in self.entries if e.split == name)

    def url(self, entry: SnapshotEntry) -> str:
        """Where ``entry``'s file is."""
        return resolve(self.root, entry.path)

    def without(self, paths: Iterable[str]) -> Snapshot:
        """This snapshot without the entries of ``paths``."""
        drop = set(paths)
        return dataclasses.replace(self, entries=tuple(e for e in self.entries if e.path not in drop))

    def frame(self) -> Any:
        """The entries as a pandas DataFrame with :data:`COLUMNS` (for Parquet and ``mlflow.data``)."""
        import pandas as pd

        return pd.DataFrame([[getattr(e, c) for c in COLUMNS] for e in self.entries], columns=list(COLUMNS))


def split_by_hash(sha256: str) -> str:
    """The split of an image its source gives none: ``"test"`` for a fixed :data:`TEST_FRACTION` of hashes."""
    return "test" if int(sha256[:12], 16) < TEST_FRACTION * 16**12 else "train"


def take_snapshot(
    source: str, storage_options: Mapping[str, Any] | None = None, cache_dir: str | None = None
) -> Snapshot:
    """List folder or manifest ``source`` and identify every file by its sha256 (cached in ``cache_dir``).

    Files of a remote source are kept in ``cache_dir``'s blob cache as they are read, so this node
    fetches each once. Nothing is decoded here (the validation step does that).

    Raises:
        tasks.domain.data_source.DataSourceError: the source is missing, unreadable or badly laid out.
    """
    listing = list_source(source, storage_options)
    cache = HashCache(cache_dir or "~/.trainlib/datasets")
    filesystems: dict[str, Any] = {}

    def fs_of(url: str) -> Any:
        scheme = url.split("://", 1)[0] if "://" in url else "file"
        if scheme not in filesystems:
            filesystems[scheme] = open_fs(url, storage_options)[0]
        return filesystems[scheme]

    to_hash = []
    for f in listing.files:
        url = listing.url(f.path)
        path = fs_of(url)._strip_protocol(url) if "://" in url else url
        to_hash.append(FileToHash(url=url, path=path, size=f.size, version=f.version))
    remote = "://" in listing.root or any("://" in f.path for f in listing.files)
    hashes = cache.hash_files(lambda f: fs_of(f.url).cat_file(f.path), to_hash, keep_blobs=remote)
    entries = tuple(
        SnapshotEntry(
            path=f.path,
            label=f.label,
            split=f.split or split_by_hash(hashes[h.url]),
            sha256=hashes[h.url],
            size=f.size,
            batch=f.batch,
        )
        for f, h in zip(listing.files, to_hash, strict=True)
    )
    snapshot = Snapshot(source=listing.source, entries=entries, root=listing.root)
    logger.info(
        "Snapshot of %s: %d file(s), %d class(es), digest %s",
        mask_url(listing.source),
        len(entries),
        len(snapshot.class_names),
        snapshot.digest[:12],
    )
    return snapshot


def write_snapshot(snapshot: Snapshot, url: str, storage_options: Mapping[str, Any] | None = None) -> str:
    """Write ``snapshot`` as Parquet (:data:`COLUMNS`; source and root in the file's metadata) to ``url``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(snapshot.frame(), preserve_index=False)
    meta = {METADATA_KEY: json.dumps({"source": snapshot.source, "root": snapshot.root}).encode()}
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    location = expand_path(url)
    fs, path = open_fs(location, storage_options)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    tmp = f"{path}.part"
    with fs.open(tmp, "wb") as handle:
        handle.write(buffer.getvalue())
    fs.mv(tmp, path)
    return location


def read_snapshot(url: str, storage_options: Mapping[str, Any] | None = None) -> Snapshot:
    """The snapshot :func:`write_snapshot` wrote to ``url``.

    Raises:
        FileNotFoundError: nothing at ``url``.
    """
    import pyarrow.parquet as pq

    fs, path = open_fs(expand_path(url), storage_options)
    with fs.open(path, "rb") as handle:
        table = pq.read_table(handle)
    meta = json.loads((table.schema.metadata or {}).get(METADATA_KEY, b"{}"))
    rows = table.to_pydict()
    entries = tuple(
        SnapshotEntry(
            path=rows["path"][i],
            label=rows["label"][i],
            split=rows["split"][i],
            sha256=rows["sha256"][i],
            size=int(rows["size"][i]),
            batch=rows["batch"][i] or "",
        )
        for i in range(table.num_rows)
    )
    return Snapshot(source=meta.get("source", ""), entries=entries, root=meta.get("root", ""))
