"""Fetching a data set's files from mirrors into a local cache, md5-verified. Runs on the driver and workers.

The pipeline's download step fetches from the official mirrors (or ``TRAINLIB_DATA_MIRRORS``);
every worker node then fetches the staged copy from run storage into its own cache with the
same call, checked against the same md5s. The cache never holds a partial or wrong file. This module
checks the arguments and the cache; :mod:`tasks.domain.mirror_fetch` fetches each missing file from the
mirrors in turn.

Example::

    files = fetch_dataset("fashion-mnist", "~/.trainlib/datasets", mirrors=["/data/fashion-mnist"])
    files.paths["t10k-images-idx3-ubyte.gz"]
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from tasks.domain.dataset_registry import DatasetSpec, get_dataset_spec
from tasks.domain.file_copy import md5_file
from tasks.domain.mirror_fetch import DatasetDownloadError, MirrorFetcher, resolve_mirrors, sweep_dead_parts
from tasks.domain.urls import expand_path

logger = logging.getLogger("trainlib")

DEFAULT_TIMEOUT_S = 60.0  # per socket operation of one HTTP download
DEFAULT_ATTEMPTS = 3  # tries per mirror on transient errors
DEFAULT_BACKOFF_S = 1.0  # about the wait before the 2nd try; doubles for each further one
# The most one data-set file may take when its size is not announced (no Content-Length): a mirror that streams
# without end stops here instead of filling the disk. The largest known file (FashionMNIST's training images) is 26 MB.
DEFAULT_MAX_FILE_BYTES = 1 << 30


@dataclasses.dataclass(frozen=True)
class DatasetFiles:
    """The verified local copy of a data set, as returned by :func:`fetch_dataset`.

    Attributes:
        name: the data set's name.
        folder: the local folder holding the files.
        paths: filename -> local path.
        md5s: filename -> md5 that each file was verified against.
        downloaded: files fetched from a mirror by this call.
        cached: files already in the cache with the right md5 (not downloaded).
        sources: filename -> URL each downloaded file came from (masked).
    """

    name: str
    folder: str
    paths: dict[str, str]
    md5s: dict[str, str]
    downloaded: tuple[str, ...]
    cached: tuple[str, ...]
    sources: dict[str, str]


def fetch_dataset(
    name: str,
    cache_dir: str | os.PathLike,
    mirrors: Iterable[str] | str | None = None,
    *,
    md5s: Mapping[str, str] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    attempts_per_mirror: int = DEFAULT_ATTEMPTS,
    backoff_s: float = DEFAULT_BACKOFF_S,
    storage_options: Mapping[str, Any] | None = None,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> DatasetFiles:
    """Make every file of data set ``name`` present and md5-verified in ``cache_dir/name/``.

    A file already in the cache with the right md5 is not downloaded again. Any
    other file is fetched from the mirrors in order, into a temporary name in the
    cache, and renamed only once its md5 matches, so the cache never holds a
    partial or wrong file (several processes may fetch into one cache at once).

    Args:
        name: a key of :data:`DATASETS`, e.g. ``"fashion-mnist"``.
        cache_dir: local folder; files go to ``cache_dir/name/``.
        mirrors: base URLs tried in order: ``http(s)://`` (urllib), ``file://``, a
            local folder path, or any fsspec URL such as ``s3://bucket/prefix``. A
            string is split at commas. Default: the comma-separated list in the
            ``TRAINLIB_DATA_MIRRORS`` environment variable, else the official mirrors.
        md5s: filename -> md5 replacing the registry's checksums, for data written
            by :func:`write_idx_dataset` or staged copies (pass ``files.md5s``).
        timeout_s: socket timeout of each HTTP request.
        attempts_per_mirror: tries per mirror on transient network errors
            (connection refused or reset, timeouts, HTTP 5xx/429), as :func:`trainlib.errors.is_transient`
            decides.
        backoff_s: about the wait before the second try (jittered); doubles for each further one.
        storage_options: passed to fsspec for fsspec mirrors (e.g. an S3 endpoint).
        max_file_bytes: the most one file may take; a download stops at its announced size (Content-Length) or
            at this bound, whichever is smaller, and that mirror fails with the reason.

    Returns:
        The :class:`DatasetFiles`, with which files were downloaded and which cached.

    Raises:
        ValueError: unknown ``name`` or bad arguments.
        DatasetDownloadError: a file matched its md5 on no mirror; the message lists
            every URL tried with its error (a checksum mismatch names the file, the
            expected and the actual md5).

    Example::

        files = fetch_dataset("fashion-mnist", "/tmp/cache", mirrors=["/data/fashion-mnist"])
        files.paths["t10k-images-idx3-ubyte.gz"]
    """
    spec = get_dataset_spec(name)
    expected = _expected_md5s(spec, md5s)
    mirror_list = resolve_mirrors(spec, mirrors)
    if not isinstance(attempts_per_mirror, int) or attempts_per_mirror < 1:
        raise ValueError(f"attempts_per_mirror={attempts_per_mirror!r} must be an int >= 1.")
    if not timeout_s or timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s!r} must be > 0 seconds.")
    if backoff_s < 0:
        raise ValueError(f"backoff_s={backoff_s!r} must be >= 0 seconds.")

    folder = os.path.join(expand_path(cache_dir), spec.name)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise DatasetDownloadError(
            f"Cannot create the data-set cache folder {folder!r}: {exc}. Pass a writable cache_dir.", dataset=spec.name
        ) from None

    fetcher = MirrorFetcher(
        spec.name,
        folder,
        mirror_list,
        timeout_s,
        attempts_per_mirror,
        backoff_s,
        dict(storage_options or {}),
        max_file_bytes,
    )
    sweep_dead_parts(folder)
    paths, downloaded, cached, sources = {}, [], [], {}
    for filename, md5 in expected.items():
        path = os.path.join(folder, filename)
        paths[filename] = path
        if os.path.isfile(path):
            actual = md5_file(path)
            if actual == md5:
                cached.append(filename)
                continue
            logger.warning("Cached %s has md5 %s, expected %s; downloading it again.", path, actual, md5)
        sources[filename] = fetcher.fetch(filename, md5, path)
        downloaded.append(filename)
    logger.info("Data set %s in %s: %d file(s) downloaded, %d cached.", spec.name, folder, len(downloaded), len(cached))
    return DatasetFiles(
        name=spec.name,
        folder=folder,
        paths=paths,
        md5s=dict(expected),
        downloaded=tuple(downloaded),
        cached=tuple(cached),
        sources=sources,
    )


def _expected_md5s(spec: DatasetSpec, md5s: Mapping[str, str] | None) -> dict[str, str]:
    if md5s is None:
        return dict(spec.files)
    known = [f for f, _ in spec.files]
    if set(md5s) != set(known):
        raise ValueError(f"md5s must give exactly the files of {spec.name!r}: {known}; got {sorted(md5s)}.")
    for filename, md5 in md5s.items():
        if not (isinstance(md5, str) and len(md5) == 32 and all(c in "0123456789abcdef" for c in md5.lower())):
            raise ValueError(f"md5s[{filename!r}]={md5!r} is not an md5 (32 hex digits).")
    return {f: md5s[f].lower() for f in known}
