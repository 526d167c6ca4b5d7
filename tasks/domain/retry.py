"""Retrying transient network and storage errors with exponential backoff. Runs anywhere.

A transient error is one where trying the same URL again may help: connection refused or
reset, timeouts, HTTP 5xx/408/429, botocore/aiohttp errors. A 404, a missing local file or
a bad certificate is permanent and raised at once.

Example::

    retry_with_backoff("Uploading f", lambda: fs.put_file(src, dest))
"""

from __future__ import annotations

import http.client
import logging
import socket
import ssl
import time
import urllib.error
from typing import Callable, TypeVar

logger = logging.getLogger("trainlib")

T = TypeVar("T")

DEFAULT_ATTEMPTS = 3     # tries of one operation on transient errors
DEFAULT_BACKOFF_S = 1.0  # wait before the 2nd try; doubles for each further one


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the same operation may help (network blips), as opposed to 404s and bad URLs."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code in (408, 429) or exc.code >= 500
    if isinstance(exc, urllib.error.URLError):
        exc = exc.reason if isinstance(exc.reason, BaseException) else None
        if exc is None:
            return False
    if isinstance(exc, socket.gaierror):
        return exc.errno == socket.EAI_AGAIN  # "temporary failure in name resolution"
    if isinstance(exc, (ssl.SSLCertVerificationError, FileNotFoundError, PermissionError,
                        IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (http.client.HTTPException, TimeoutError, ConnectionError, OSError)):
        return True
    return type(exc).__module__.startswith(("botocore", "aiobotocore", "urllib3", "aiohttp"))


def describe_error(exc: BaseException) -> str:
    """A one-line description of a network or storage error (``HTTP 404 Not Found``, ...)."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        return f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
    if isinstance(exc, http.client.IncompleteRead):
        return f"connection closed early, {exc.expected} byte(s) missing"
    return f"{type(exc).__name__}: {exc}"


def retry_with_backoff(what: str, func: Callable[[], T], attempts: int = DEFAULT_ATTEMPTS,
                       backoff_s: float = DEFAULT_BACKOFF_S) -> T:
    """Call ``func``; on a transient error wait ``backoff_s`` (doubling) and try again, ``attempts`` times in all.

    Raises:
        Exception: ``func``'s error when it is permanent or the last attempt fails.
    """
    delay = backoff_s
    for attempt in range(1, attempts + 1):
        try:
            return func()
        except Exception as exc:  # noqa: BLE001 - classified below
            if not is_transient(exc) or attempt == attempts:
                raise
            logger.warning("%s failed (%s); retrying in %.1fs (attempt %d of %d).", what,
                           describe_error(exc), delay, attempt, attempts)
            time.sleep(delay)
            delay *= 2
    raise AssertionError("unreachable")
