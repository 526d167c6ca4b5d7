"""Tests of trainlib._internal.util.retry (public as trainlib.errors.with_retries...): which I/O errors are retried
(storage, HTTP, DNS, TLS) and the one-line descriptions."""

from __future__ import annotations

import errno
import http.client
import socket
import ssl
import urllib.error

import pytest

from trainlib._internal import tunables
from trainlib._internal.util.retry import describe_error, is_transient, with_retries
from trainlib.errors import StorageError


def http_error(code: int, reason: str) -> urllib.error.HTTPError:
    return urllib.error.HTTPError("http://mirror/f.gz", code, reason, {}, None)


@pytest.mark.parametrize("code", [408, 429, 500, 502, 503, 504])
def test_http_busy_or_broken_server_is_transient(code):
    assert is_transient(http_error(code, "busy"))


@pytest.mark.parametrize("code", [400, 401, 403, 404, 410])
def test_http_client_errors_are_permanent(code):
    assert not is_transient(http_error(code, "no"))


@pytest.mark.parametrize(
    "reason, transient",
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), True),
        (TimeoutError("timed out"), True),
        (socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"), True),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), False),
        (ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed certificate"), False),
        (PermissionError(errno.EACCES, "Permission denied"), False),
        ("unknown url type: gopher", False),
    ],
)
def test_urlerror_is_judged_by_its_reason(reason, transient):
    assert is_transient(urllib.error.URLError(reason)) is transient
    if isinstance(reason, BaseException):
        assert is_transient(reason) is transient


def test_http_client_errors_mid_body_are_transient():
    assert is_transient(http.client.IncompleteRead(b"", 100))
    assert is_transient(http.client.RemoteDisconnected("Remote end closed connection without response"))
    assert is_transient(ssl.SSLEOFError(8, "EOF occurred in violation of protocol"))


def test_storage_classification_is_unchanged():
    assert is_transient(ConnectionResetError(errno.ECONNRESET, "reset"))
    assert is_transient(OSError("s3fs: SlowDown"))
    assert not is_transient(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_transient(FileNotFoundError(errno.ENOENT, "no such key"))


def test_describe_error_is_one_line():
    assert describe_error(http_error(404, "Not Found")) == "HTTP 404 Not Found"
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    assert describe_error(urllib.error.URLError(refused)) == "ConnectionRefusedError: [Errno 111] Connection refused"
    assert describe_error(urllib.error.URLError("unknown url type: gopher")) == "unknown url type: gopher"
    assert describe_error(http.client.IncompleteRead(b"", 7)) == "connection closed early, 7 byte(s) missing"
    assert describe_error(TimeoutError("read timed out")) == "TimeoutError: read timed out"


# -- with_retries (fast_retries: tests/conftest.py) ---------------------------------


def test_transient_errors_are_retried(fast_retries):
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("connection reset by peer")
        return "ok"

    assert with_retries("uploading x", flaky) == "ok" and len(attempts) == 3


def test_retries_give_up_with_a_storage_error(fast_retries):
    def down():
        raise TimeoutError("read timed out")

    with pytest.raises(StorageError) as info:
        with_retries("uploading model.pt to s3://b/run/checkpoint_000001/model.pt", down)
    text = str(info.value)
    assert f"after {tunables.STORAGE_RETRY_ATTEMPTS} attempts" in text
    assert "s3://b/run/checkpoint_000001/model.pt" in text and "TimeoutError: read timed out" in text
    assert "reachable" in text


def test_permanent_errors_are_not_retried(fast_retries):
    attempts = []

    def missing():
        attempts.append(1)
        raise FileNotFoundError("no such key")

    with pytest.raises(FileNotFoundError):
        with_retries("reading x", missing)
    assert len(attempts) == 1


def test_without_error_class_the_last_error_is_raised(fast_retries):
    calls = []

    def busy():
        calls.append(1)
        raise http_error(503, "Service Unavailable")

    with pytest.raises(urllib.error.HTTPError) as info:
        with_retries("fetching f.gz", busy, attempts=3, error=None)
    assert info.value.code == 503 and len(calls) == 3


def test_without_error_class_a_permanent_error_is_raised_at_once(fast_retries):
    calls = []

    def missing():
        calls.append(1)
        raise http_error(404, "Not Found")

    with pytest.raises(urllib.error.HTTPError):
        with_retries("fetching f.gz", missing, attempts=3, error=None)
    assert len(calls) == 1


def test_permanent_http_error_names_the_fix(fast_retries):
    def forbidden():
        raise http_error(403, "Forbidden")

    with pytest.raises(StorageError, match=r"reading f.gz failed: HTTP 403 Forbidden\. Fix: .*credentials"):
        with_retries("reading f.gz", forbidden)


def test_untrusted_certificate_is_not_called_a_permission_problem(fast_retries):
    def untrusted():
        raise ssl.SSLCertVerificationError(1, "certificate verify failed")

    with pytest.raises(StorageError) as info:
        with_retries("reading https://host/f.gz", untrusted)
    assert "certificate" in str(info.value) and "write access" not in str(info.value)


def test_the_pipeline_gets_the_same_retry_rule_from_trainlib_errors():
    import trainlib.errors

    assert trainlib.errors.with_retries is with_retries
    assert trainlib.errors.is_transient is is_transient and trainlib.errors.describe_error is describe_error
    with pytest.raises(AttributeError, match="no attribute 'retry_forever'"):
        trainlib.errors.retry_forever  # noqa: B018
