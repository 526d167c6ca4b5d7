"""Staging a verified data set to run storage, so every worker node reads the same files. Runs on the driver.

The pipeline's download step calls :func:`fetch_and_stage`: fetch from the mirrors into the
local cache (md5-verified), then copy to ``<storage>/datasets/<name>/`` (a shared folder or
``s3://``). Workers call :func:`fetch_staged` to pull that copy into their node's cache,
verified against the same md5s.

Example::

    staged = fetch_and_stage("fashion-mnist", None, "~/.trainlib/datasets", "s3://bucket/runs/datasets")
    files = fetch_staged(staged, "/local/cache")  # on a worker
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import posixpath
import shutil
import uuid
from collections.abc import Mapping
from typing import Any

import fsspec

from tasks.domain.dataset_fetch import DatasetFiles, fetch_dataset
from tasks.domain.mirror_fetch import DatasetDownloadError
from tasks.domain.urls import expand_path, join_url, mask_url
from trainlib.errors import describe_error, with_retries

logger = logging.getLogger("trainlib")


@dataclasses.dataclass(frozen=True)
class StagedDataset:
    """A verified data set and where workers read it.

    Attributes:
        name: the data set's name.
        staged_url: the folder in run storage holding the files (a path or a URL).
        md5s: filename -> md5, for workers to verify their copy.
        local_folder: the verified copy in the downloading node's cache.
        downloaded: files fetched from a mirror by this run (empty when all were cached).
        cached: files found in the cache.
        sources: filename -> URL each downloaded file came from (masked).
    """

    name: str
    staged_url: str
    md5s: dict[str, str]
    local_folder: str
    downloaded: tuple[str, ...]
    cached: tuple[str, ...]
    sources: dict[str, str]


def fetch_and_stage(
    name: str, mirrors: list[str] | None, cache_dir: str, staging_url: str, md5s: Mapping[str, str] | None = None
) -> StagedDataset:
    """Fetch ``name`` into ``cache_dir`` (from ``mirrors``, or the environment's / official ones) and
    copy it to ``staging_url/<name>``. ``md5s`` replaces the registry's checksums (generated data)."""
    files = fetch_dataset(name, expand_path(cache_dir), mirrors or None, md5s=md5s)
    staged = stage_dataset(files, staging_url)
    return StagedDataset(
        name=files.name,
        staged_url=staged,
        md5s=dict(files.md5s),
        local_folder=files.folder,
        downloaded=tuple(files.downloaded),
        cached=tuple(files.cached),
        sources=dict(files.sources),
    )


def fetch_staged(staged: StagedDataset, node_cache_dir: str) -> DatasetFiles:
    """This node's verified copy of the staged data set, in ``node_cache_dir`` (fetched once per node)."""
    return fetch_dataset(staged.name, expand_path(node_cache_dir), mirrors=[staged.staged_url], md5s=staged.md5s)


def stage_dataset(
    files: DatasetFiles, storage_url: str | os.PathLike, storage_options: Mapping[str, Any] | None = None
) -> str:
    """Copy the verified files of ``files`` to ``<storage_url>/<name>/`` so every node reads them.

    A file already there with the same size is skipped. Local files are written
    under a temporary name and renamed; object stores put each file whole.

    Args:
        files: what :func:`fetch_dataset` returned.
        storage_url: a local or shared folder, or an fsspec URL such as ``s3://bucket/datasets``.
        storage_options: passed to fsspec (credentials, ``client_kwargs={"endpoint_url": ...}``);
            never printed.

    Returns:
        The staged folder (a local path, or a URL), to use as a mirror on workers:
        ``fetch_dataset(files.name, node_cache, mirrors=[url], md5s=files.md5s)``.

    Raises:
        DatasetDownloadError: the storage could not be written (after retries for
            transient errors); the message says which file and why.

    Example::

        url = stage_dataset(files, "s3://my-bucket/datasets")  # "s3://my-bucket/datasets/fashion-mnist"
    """
    staged_url = join_url(expand_path(storage_url), files.name)
    shown = mask_url(staged_url)
    try:
        fs, root = fsspec.core.url_to_fs(staged_url, **dict(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise DatasetDownloadError(
            f"Cannot open storage {shown}: {type(exc).__name__}: {exc}. Use a local folder or an fsspec URL "
            "whose package is installed (s3:// needs s3fs).",
            dataset=files.name,
        ) from None
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    local = protocol in ("file", "local")

    uploaded, skipped = [], []
    for filename, path in files.paths.items():
        size = os.path.getsize(path)
        dest = posixpath.join(root, filename)
        what = f"Staging {filename} of {files.name!r} to {shown}"
        try:
            fs.invalidate_cache(root)
            try:
                if fs.info(dest).get("size") == size:
                    skipped.append(filename)
                    continue
            except FileNotFoundError:
                pass
            with_retries(what, functools.partial(_put, fs, path, dest, local), error=None)
            if fs.info(dest).get("size") != size:
                raise OSError(f"{dest} has size {fs.info(dest).get('size')} after upload, expected {size}")
        except Exception as exc:  # noqa: BLE001 - reported with what to do
            raise DatasetDownloadError(
                f"{what} failed: {describe_error(exc)}. Check storage_url (bucket name, path) and "
                "storage_options (credentials, endpoint), and that the storage is writable.",
                dataset=files.name,
                filename=filename,
                attempts=[(shown, describe_error(exc))],
            ) from None
        uploaded.append(filename)
    logger.info(
        "Staged %s to %s: uploaded %s, skipped (already there) %s.",
        files.name,
        shown,
        uploaded or "none",
        skipped or "none",
    )
    return staged_url


def _put(fs: fsspec.AbstractFileSystem, path: str, dest: str, local: bool) -> None:
    if not local:
        fs.put_file(path, dest)
        return
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.{uuid.uuid4().hex}.part"
    try:
        shutil.copyfile(path, tmp)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
