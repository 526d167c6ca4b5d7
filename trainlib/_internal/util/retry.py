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


def with_retries(what: str, func: Callable[[], T], *, attempts: int | None = None,
                 base_delay_s: float | None = None, max_delay_s: float | None = None,
                 retryable: Callable[[BaseException], bool] = is_transient,
                 error: type[Exception] = StorageError) -> T:
    """Run ``func``; retry ``retryable`` errors with jittered exponential backoff, then raise ``error``.

    The defaults are storage's (``tunables.STORAGE_RETRY_*``, ``StorageError``); other
    repeatable I/O passes its own. With the default classification, a permanent I/O error
    (full disk, permission, missing bucket, name too long) raises ``error`` at once naming the
    cause and the fix; a plain missing file (FileNotFoundError) propagates, for callers that
    check for it. Other errors that are not retryable propagate at once.
    """
    attempts = attempts or tunables.STORAGE_RETRY_ATTEMPTS
    delay = tunables.STORAGE_RETRY_BASE_DELAY_S if base_delay_s is None else base_delay_s
    max_delay = tunables.STORAGE_RETRY_MAX_DELAY_S if max_delay_s is None else max_delay_s
    for attempt in range(1, attempts + 1):
        try:
            return func()
        except Exception as exc:  # noqa: BLE001 - classified below
            if not retryable(exc):
                plain_missing = isinstance(exc, FileNotFoundError) and not is_missing_bucket(exc)
                if retryable is is_transient and _is_io_error(exc) and not plain_missing:
                    fault = classify(exc)
                    raise error(f"{what} failed: {fault.cause}" + (f". Fix: {fault.fix}." if fault.fix else ".")) \
                        from None
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
