"""Prefect task: fetch the data set (md5-verified, cached) and stage it to run storage.

Runs on a Ray worker in the pipeline. Wraps ``tasks.datasets.fetch_dataset`` and
``stage_dataset``: files already in the local cache with the right md5 are not
downloaded again, so a second pipeline run downloads nothing. Only transient
network failures are retried; an unknown data set, a checksum mismatch or a
missing file fail at once with the message of ``tasks.datasets``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from tasks.datasets import DatasetDownloadError, fetch_dataset, stage_dataset

# Prefect-level retries of a download whose every failure was a network error. fetch_dataset
# already retries each mirror a few times, so one more round after a pause is enough.
DOWNLOAD_TASK_RETRIES = 1
DOWNLOAD_TASK_RETRY_DELAY_S = 2


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
        sources: filename -> URL each downloaded file came from.
    """

    name: str
    staged_url: str
    md5s: dict[str, str]
    local_folder: str
    downloaded: tuple[str, ...]
    cached: tuple[str, ...]
    sources: dict[str, str]


def is_transient_download_failure(exc: BaseException | None) -> bool:
    """True when every mirror failed for a network reason (worth retrying later).

    A checksum mismatch, an unknown data set, a missing local file or any other
    error is permanent: retrying would only delay the message.
    """
    if not isinstance(exc, DatasetDownloadError) or not exc.attempts:
        return False
    # fetch_dataset marks a mirror that stayed unreachable through its retries with
    # "(after N attempt(s))", and later files skip it as "unreachable earlier".
    return all(error.endswith("attempt(s))") or error.startswith("skipped, unreachable")
               for _, error in exc.attempts)


def _retry_on_network_errors(task: Any, task_run: Any, state: Any) -> bool:
    return is_transient_download_failure(state.data if isinstance(state.data, BaseException) else None)


def fetch_and_stage(name: str, mirrors: list[str] | None, cache_dir: str, staging_url: str) -> StagedDataset:
    """Fetch ``name`` into ``cache_dir`` (from ``mirrors``, or the environment's / official ones) and
    copy it to ``staging_url/<name>``. Plain function behind :func:`download_dataset`."""
    files = fetch_dataset(name, os.path.expanduser(cache_dir), mirrors or None)
    staged = stage_dataset(files, staging_url)
    return StagedDataset(name=files.name, staged_url=staged, md5s=dict(files.md5s), local_folder=files.folder,
                         downloaded=tuple(files.downloaded), cached=tuple(files.cached), sources=dict(files.sources))


@task(name="download-dataset", retries=DOWNLOAD_TASK_RETRIES, retry_delay_seconds=DOWNLOAD_TASK_RETRY_DELAY_S,
      retry_condition_fn=_retry_on_network_errors, cache_policy=NO_CACHE)
def download_dataset(name: str, mirrors: list[str] | None, cache_dir: str, staging_url: str) -> StagedDataset:
    """Fetch, verify and stage the data set; log what was downloaded and what came from the cache."""
    logger = get_run_logger()
    staged = fetch_and_stage(name, mirrors, cache_dir, staging_url)
    if staged.downloaded:
        logger.info("Downloaded %d file(s) of %s: %s", len(staged.downloaded), name,
                    ", ".join(f"{f} from {staged.sources[f]}" for f in staged.downloaded))
    logger.info("%s: %d file(s) from the cache %s, staged to %s", name, len(staged.cached), staged.local_folder,
                staged.staged_url)
    return staged
