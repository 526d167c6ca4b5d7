"""Retry with backoff for transient I/O errors. Used on the driver and in worker actors.

Which errors are transient is decided in :mod:`trainlib._internal.util.io_faults`: only
network-ish ones are retried; a full disk, a refused permission, a missing bucket or a name
too long fail at once with a StorageError that names the path, the real cause and the fix.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Callable, TypeVar

from trainlib._internal import tunables
from trainlib._internal.util.io_faults import classify, is_missing_bucket
from trainlib.errors import StorageError

logger = logging.getLogger("trainlib")

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is an I/O error that a retry may fix (network, timeouts), not a full disk or a bad request."""
    return classify(exc).transient


def _is_io_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) or type(exc).__module__.startswith(("botocore", "aiobotocore", "s3fs"))


def with_retries(what: str, func: Callable[[], T]) -> T:
    """Run ``func``; retry transient I/O errors with backoff, then raise StorageError.

    A permanent I/O error raises StorageError at once, except a plain missing file
    (FileNotFoundError), which callers check for; a missing bucket is a StorageError.
    """
    delay = tunables.STORAGE_RETRY_BASE_DELAY_S
    for attempt in range(1, tunables.STORAGE_RETRY_ATTEMPTS + 1):
        try:
            return func()
        except Exception as exc:  # noqa: BLE001 - classified below
            if not _is_io_error(exc):
                raise
            fault = classify(exc)
            if not fault.transient:
                if isinstance(exc, FileNotFoundError) and not is_missing_bucket(exc):
                    raise
                raise StorageError(f"{what} failed: {fault.cause}" + (f". Fix: {fault.fix}." if fault.fix else ".")) \
                    from None
            if attempt == tunables.STORAGE_RETRY_ATTEMPTS:
                raise StorageError(
                    f"{what} failed after {attempt} attempts: {fault.cause}. Check that the "
                    "storage is reachable (endpoint, network, bucket) and retry."
                ) from None
            logger.warning("%s failed (%s); retrying in %.1fs (attempt %d of %d)", what, fault.cause, delay, attempt,
                           tunables.STORAGE_RETRY_ATTEMPTS)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, tunables.STORAGE_RETRY_MAX_DELAY_S)
    raise AssertionError("unreachable")
