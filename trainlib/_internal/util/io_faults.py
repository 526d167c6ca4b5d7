"""What an I/O exception means: retry it (network-ish) or stop at once with the real cause. Driver and workers.

Only errors that a retry can fix are transient: lost or refused connections, timeouts,
throttling and server errors of object stores, NFS's stale handles. A full disk, a refused
permission, a read-only filesystem, a missing bucket or a name too long fail at once, and the
message says which, with the fix.
"""

from __future__ import annotations

import dataclasses
import errno

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
_TRANSIENT = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EHOSTUNREACH,
              errno.ENETUNREACH, errno.ENETDOWN, errno.EPIPE, errno.EAGAIN, errno.EBUSY, errno.EIO, errno.ESTALE,
              errno.EINTR}
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


def classify(exc: BaseException) -> IOFault:
    """Classify ``exc`` raised by a storage call."""
    cause = f"{type(exc).__name__}: {exc}"
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
        _error_code(exc) == "NoSuchBucket" or "bucket does not exist" in str(exc).lower())
