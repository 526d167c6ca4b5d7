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


def with_retries(what: str, func: Callable[[], T], *, attempts: int | None = None,
                 base_delay_s: float | None = None, max_delay_s: float | None = None,
                 retryable: Callable[[BaseException], bool] = is_transient,
                 error: type[Exception] = StorageError) -> T:
    """Run ``func``; retry ``retryable`` errors with jittered exponential backoff, then raise ``error``.

    The defaults are storage's (``tunables.STORAGE_RETRY_*``, ``StorageError``); other
    repeatable I/O passes its own. Errors that are not retryable propagate at once.
    """
    attempts = attempts or tunables.STORAGE_RETRY_ATTEMPTS
    delay = tunables.STORAGE_RETRY_BASE_DELAY_S if base_delay_s is None else base_delay_s
    max_delay = tunables.STORAGE_RETRY_MAX_DELAY_S if max_delay_s is None else max_delay_s
    for attempt in range(1, attempts + 1):
        try:
            return func()
        except Exception as exc:  # noqa: BLE001 - classified below
            if not retryable(exc):
                raise
            if attempt == attempts:
                raise error(
                    f"{what} failed after {attempt} attempts: {type(exc).__name__}: {exc}. Check that the "
                    "storage is reachable (endpoint, network, bucket) and retry."
                ) from None
            logger.warning("%s failed (%s: %s); retrying in %.1fs (attempt %d of %d)", what,
                           type(exc).__name__, exc, delay, attempt, attempts)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, max_delay)
    raise AssertionError("unreachable")
