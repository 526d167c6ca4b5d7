"""What an I/O exception means: retry it (network-ish) or stop at once with the real cause. Driver and workers.

Only errors that a retry can fix are transient: lost or refused connections, timeouts,
throttling and server errors of object stores and HTTP servers (408, 429, 5xx), a name server
that is briefly unavailable, NFS's stale handles. A full disk, a refused permission, a
read-only filesystem, a missing bucket, a name too long, an HTTP 404 or an untrusted
certificate fail at once, and the message says which, with the fix.
"""

from __future__ import annotations

import dataclasses
import errno
import http.client
import socket
import ssl
import urllib.error

# errno values that mean "this will not work however often you try", with the fix to suggest.
_PERMANENT = {
    errno.ENOSPC: "free space on that disk or use a bigger one (or keep fewer checkpoints: CheckpointConfig.num_to_keep)",
    errno.EDQUOT: "raise the quota or free space (or keep fewer checkpoints: CheckpointConfig.num_to_keep)",
    errno.EFBIG: "the file is larger than the filesystem allows: save smaller files",
    errno.EACCES: "give this user write access to the folder, or use another storage_path",
    errno.EPERM: "give this user write access to the folder, or use another storage_path",
    errno.EROFS: "the filesystem is mounted read-only: use a writable storage_path",
    errno.ENAMETOOLONG: "use a shorter RunConfig.name or storage_path",
    errno.EISDIR: "a folder is in the way of a file: remove it or use another storage_path",
    errno.ENOTDIR: "a file is in the way of a folder: remove it or use another storage_path",
    errno.EEXIST: "something is in the way: remove it or use another storage_path",
}
# errno values worth a retry: the network or the server, not the request.
_TRANSIENT = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ENETDOWN,
    errno.EPIPE,
    errno.EAGAIN,
    errno.EBUSY,
    errno.EIO,
    errno.ESTALE,
    errno.EINTR,
}
# Object-store answers that are final (botocore error codes, also found in s3fs's messages).
_PERMANENT_CODES = {
    "NoSuchBucket": "the bucket does not exist: create it, or fix the bucket in storage_path",
    "AccessDenied": "the credentials may not do this: check the bucket policy and the credentials",
    "InvalidAccessKeyId": "the access key is unknown: check the credentials",
    "SignatureDoesNotMatch": "the secret key is wrong: check the credentials",
    "InvalidBucketName": "the bucket name is invalid: fix storage_path",
    "KeyTooLongError": "the object key is too long: use a shorter RunConfig.name or storage_path",
}
_TRANSIENT_MODULES = ("botocore", "aiobotocore", "urllib3", "aiohttp", "requests")
# HTTP answers worth a retry: the server is busy or broken for now, not the request wrong.
_TRANSIENT_HTTP = {408, 429}
_HTTP_FIXES = {
    401: "the server wants credentials: check them",
    403: "the server refuses access: check the credentials and the URL",
    404: "nothing is at that URL: check the URL (or the mirror's folder)",
}


@dataclasses.dataclass(frozen=True)
class IOFault:
    """An I/O error, classified: whether to retry, and for a permanent one the cause and the fix."""

    transient: bool
    cause: str
    fix: str = ""


def _error_code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def describe_error(exc: BaseException) -> str:
    """One line naming an I/O error: ``HTTP 404 Not Found``, ``ConnectionRefusedError: ...``."""
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason
        return f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
    if isinstance(exc, http.client.IncompleteRead):
        return f"connection closed early, {exc.expected} byte(s) missing"
    return f"{type(exc).__name__}: {exc}"


def _classify_network(exc: BaseException, cause: str) -> IOFault | None:
    """The HTTP, name-resolution and TLS errors of a download; None for anything else."""
    if isinstance(exc, urllib.error.HTTPError):
        if exc.code in _TRANSIENT_HTTP or exc.code >= 500:
            return IOFault(True, cause)
        return IOFault(False, cause, _HTTP_FIXES.get(exc.code, "the server refuses the request: check the URL"))
    if isinstance(exc, urllib.error.URLError):  # urllib wraps the socket's error: judge that one
        if isinstance(exc.reason, BaseException):
            return dataclasses.replace(classify(exc.reason), cause=cause)
        return IOFault(False, cause, "check the URL")
    if isinstance(exc, socket.gaierror):
        if exc.errno == socket.EAI_AGAIN:  # "temporary failure in name resolution"
            return IOFault(True, cause)
        return IOFault(False, cause, "the host name does not resolve: check the URL's host")
    if isinstance(exc, ssl.SSLCertVerificationError):  # before errno: its errno 1 is not EPERM
        return IOFault(
            False, cause, "the server's certificate is not trusted: fix it, or the CA bundle (SSL_CERT_FILE)"
        )
    if isinstance(exc, (ssl.SSLError, http.client.HTTPException)):  # a connection cut mid-handshake or mid-body
        return IOFault(True, cause)
    return None


def classify(exc: BaseException) -> IOFault:
    """Classify ``exc`` raised by a storage call or a download."""
    cause = describe_error(exc)
    network = _classify_network(exc, cause)
    if network is not None:
        return network
    code = _error_code(exc) or _error_code(exc.__cause__ or exc)
    text = str(exc)
    for name, fix in _PERMANENT_CODES.items():
        if code == name or name in text:
            return IOFault(False, cause, fix)
    if "bucket does not exist" in text.lower():
        return IOFault(False, cause, _PERMANENT_CODES["NoSuchBucket"])
    number = getattr(exc, "errno", None)
    if number in _PERMANENT:
        return IOFault(False, cause, _PERMANENT[number])
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return IOFault(False, cause, _PERMANENT.get(number, ""))
    if number in _TRANSIENT or isinstance(exc, (ConnectionError, TimeoutError)):
        return IOFault(True, cause)
    if type(exc).__module__.startswith(_TRANSIENT_MODULES):
        return IOFault(True, cause)
    # s3fs turns unknown service errors into OSError without errno (throttling, 5xx): retry those.
    if type(exc) is OSError and number is None:
        return IOFault(True, cause)
    return IOFault(False, cause)


def is_missing_bucket(exc: BaseException) -> bool:
    """A FileNotFoundError that is about the bucket, not a key: final, and never "no such file"."""
    return isinstance(exc, FileNotFoundError) and (
        _error_code(exc) == "NoSuchBucket" or "bucket does not exist" in str(exc).lower()
    )
