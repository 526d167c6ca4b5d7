"""Prefect task: fetch the data set (md5-verified, cached) and stage it to run storage.

Runs on a Ray worker in the pipeline. Wraps :func:`tasks.domain.staging.fetch_and_stage`:
files already in the local cache with the right md5 are not downloaded again, so a second
pipeline run downloads nothing. Only transient network failures are retried; an unknown data
set, a checksum mismatch or a missing file fail at once with the domain code's message.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from tasks.domain.mirror_fetch import is_transient_download_failure
from tasks.domain.staging import StagedDataset, fetch_and_stage

# Prefect-level retries of a download whose every failure was a network error. fetch_dataset
# already retries each mirror a few times, so one more round after a pause is enough.
DOWNLOAD_TASK_RETRIES = 1
DOWNLOAD_TASK_RETRY_DELAY_S = 2
DOWNLOAD_TIMEOUT_S = 30 * 60


def _retry_on_network_errors(task: Any, task_run: Any, state: Any) -> bool:
    return is_transient_download_failure(state.data if isinstance(state.data, BaseException) else None)


@task(
    name="download-dataset",
    retries=DOWNLOAD_TASK_RETRIES,
    retry_delay_seconds=DOWNLOAD_TASK_RETRY_DELAY_S,
    retry_condition_fn=_retry_on_network_errors,
    cache_policy=NO_CACHE,
    timeout_seconds=DOWNLOAD_TIMEOUT_S,
)
def download_dataset(name: str, mirrors: list[str] | None, cache_dir: str, staging_url: str) -> StagedDataset:
    """Fetch, verify and stage the data set; log what was downloaded and what came from the cache."""
    logger = get_run_logger()
    staged = fetch_and_stage(name, mirrors, cache_dir, staging_url)
    if staged.downloaded:
        logger.info(
            "Downloaded %d file(s) of %s: %s",
            len(staged.downloaded),
            name,
            ", ".join(f"{f} from {staged.sources[f]}" for f in staged.downloaded),
        )
    logger.info(
        "%s: %d file(s) from the cache %s, staged to %s",
        name,
        len(staged.cached),
        staged.local_folder,
        staged.staged_url,
    )
    return staged
