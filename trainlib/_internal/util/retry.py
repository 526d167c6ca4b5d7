"""Retrying storage and network I/O with backoff, and telling transient errors from permanent ones. Driver and workers.

trainlib retries every call to run storage with :func:`with_retries`; the pipeline's
downloads and data-set staging use the same helper (public as :func:`trainlib.errors.with_retries`,
``is_transient`` and ``describe_error``), so one rule decides what is worth a retry. Only errors
that a retry can fix are retried: lost, refused or timed-out connections,
throttling and server errors (HTTP 408, 429, 5xx), a name server that is briefly unavailable.
A full disk, a refused permission, a missing bucket, a name too long, an HTTP 404 or an
untrusted certificate fail at once, naming the cause and the fix.

Example::

    from trainlib.errors import describe_error, with_retries

    with_retries(f"uploading {name}", lambda: fs.put_file(local, remote))  # StorageError when it gives up
    try:
        with_retries(f"fetching {url}", lambda: urlopen(url).read(), error=None)
    except Exception as exc:
        print(describe_error(exc))  # "HTTP 404 Not Found"
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from trainlib._internal import tunables
from trainlib._internal.util.io_faults import classify, describe_error, is_missing_bucket
from trainlib._internal.util.masking import redact_text
from trainlib.errors import StorageError

__all__ = ["describe_error", "is_transient", "with_retries"]

logger = logging.getLogger("trainlib")

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is an I/O error that a retry may fix (network, timeouts, HTTP 5xx), not a full disk or a 404.

    Example::

        is_transient(ConnectionResetError())  # True
        is_transient(urllib.error.HTTPError(url, 404, "Not Found", {}, None))  # False
    """
    return classify(exc).transient


def _is_io_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) or type(exc).__module__.startswith(("botocore", "aiobotocore", "s3fs"))


def with_retries(
    what: str,
    func: Callable[[], T],
    *,
    attempts: int | None = None,
    base_delay_s: float | None = None,
    max_delay_s: float | None = None,
    retryable: Callable[[BaseException], bool] = is_transient,
    error: type[Exception] | None = StorageError,
) -> T:
    """Run ``func``; retry ``retryable`` errors with jittered exponential backoff, then raise ``error``.

    Args:
        what: what ``func`` does, for the log and the error (``"uploading model.pt to s3://b/run"``).
        func: the repeatable I/O call.
        attempts: tries in all (default: storage's, ``tunables.STORAGE_RETRY_ATTEMPTS``).
        base_delay_s: about the wait before the second try (jittered 0.5x-1.5x); doubles for each further one.
        max_delay_s: the longest wait between two tries.
        retryable: which errors to retry (default :func:`is_transient`).
        error: raised when the tries are spent, or at once for a permanent I/O error, with a message
            naming ``what``, the cause and the fix. ``None`` raises ``func``'s own last error instead,
            for callers that report it themselves.

    Raises:
        ``error`` as above. With the default classification a plain missing file
        (FileNotFoundError) propagates, for callers that check for it. Errors that are not
        retryable and not I/O errors propagate at once.
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
                if error is not None and retryable is is_transient and _is_io_error(exc) and not plain_missing:
                    fault = classify(exc)
                    raise error(
                        f"{what} failed: {fault.cause}" + (f". Fix: {fault.fix}." if fault.fix else ".")
                    ) from None
                raise
            if attempt == attempts:
                if error is None:
                    raise
                raise error(
                    f"{what} failed after {attempt} attempts: {describe_error(exc)}. Check that the "
                    "storage is reachable (endpoint, network, bucket) and retry."
                ) from None
            logger.warning(
                "%s failed (%s); retrying in %.1fs (attempt %d of %d)",
                what,
                redact_text(describe_error(exc)),
                delay,
                attempt,
                attempts,
            )
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, max_delay)
    raise AssertionError("unreachable")
