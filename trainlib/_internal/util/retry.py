"""Retry with backoff for transient I/O errors. Used on the driver and in worker actors."""

from __future__ import annotations

import logging
import random
import time
from typing import Callable, TypeVar

from trainlib._internal import tunables
from trainlib.errors import StorageError

logger = logging.getLogger("trainlib")

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is an I/O error that a retry may fix (network, timeouts), not a missing file or a bad request."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    return isinstance(exc, (OSError, ConnectionError, TimeoutError)) or type(exc).__module__.startswith(
        ("botocore", "aiobotocore", "urllib3", "aiohttp")
    )


def with_retries(what: str, func: Callable[[], T]) -> T:
    """Run ``func``; retry transient I/O errors with backoff, then raise StorageError."""
    delay = tunables.STORAGE_RETRY_BASE_DELAY_S
    for attempt in range(1, tunables.STORAGE_RETRY_ATTEMPTS + 1):
        try:
            return func()
        except Exception as exc:  # noqa: BLE001 - classified below
            if not is_transient(exc):
                raise
            if attempt == tunables.STORAGE_RETRY_ATTEMPTS:
                raise StorageError(
                    f"{what} failed after {attempt} attempts: {type(exc).__name__}: {exc}. Check that the "
                    "storage is reachable (endpoint, network, bucket) and retry."
                ) from None
            logger.warning("%s failed (%s: %s); retrying in %.1fs (attempt %d of %d)", what,
                           type(exc).__name__, exc, delay, attempt, tunables.STORAGE_RETRY_ATTEMPTS)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, tunables.STORAGE_RETRY_MAX_DELAY_S)
    raise AssertionError("unreachable")
