"""Where a run's images come from: one ``data`` parameter, resolved to a listing of files. Runs on the driver.

``data`` is a built-in idx set's name (``fashion-mnist``, ``mnist``), an image-folder tree
(:mod:`tasks.domain.image_folder`) or a manifest file (:mod:`tasks.domain.image_manifest`), as a
local path or any fsspec URL (``s3://bucket/pets``). Listing reads names, sizes and versions
(mtime or ETag) only; content hashes come after (:mod:`tasks.domain.snapshot`). Every bad input
raises :class:`DataSourceError`, whose message names the parameter, the path and the fix.

Example::

    listing = list_source("s3://bucket/pets")
    listing.root, len(listing.files), listing.files[0].label
"""

from __future__ import annotations

import dataclasses
import posixpath
import urllib.parse
from collections.abc import Mapping
from typing import Any

import fsspec

from tasks.domain.dataset_registry import DATASET_NAMES
from tasks.domain.urls import expand_path, mask_url
from trainlib.masking import REDACTED, redact_text

PARAMETER = "data"  # the pipeline parameter every message names
SPLITS = ("train", "test")
MANIFEST_SUFFIXES = (".csv", ".parquet")


class DataSourceError(ValueError):
    """A data source that cannot be used; the message names the parameter, the path and the fix."""


@dataclasses.dataclass(frozen=True)
class ListedFile:
    """One file of a source, before its content is read.

    Attributes:
        path: relative to the source's root (``train/cat/1.png``), or a URL a manifest gave.
        label: the class name.
        split: ``"train"`` or ``"test"``, or ``""`` when the source does not say (the snapshot assigns it).
        batch: the arrival batch's folder name, ``""`` when the source has no batches.
        size: bytes.
        version: what changes when the file is rewritten (ETag or mtime), for the hash cache.
    """

    path: str
    label: str
    split: str
    batch: str
    size: int
    version: str


@dataclasses.dataclass(frozen=True)
class SourceListing:
    """A listed source: its ``root`` (the folder relative paths start from, a URL or absolute path) and files."""

    source: str
    root: str
    files: tuple[ListedFile, ...]

    def url(self, path: str) -> str:
        """Where file ``path`` of this listing is (a URL given by a manifest stays as it is)."""
        return resolve(self.root, path)


def resolve(root: str, path: str) -> str:
    """``path`` under ``root``, or ``path`` itself when it is a URL or absolute."""
    if "://" in path or path.startswith("/"):
        return path
    return root.rstrip("/") + "/" + path


def is_builtin(data: str) -> bool:
    """Whether ``data`` names a built-in idx set rather than a folder or manifest."""
    return data in DATASET_NAMES


def error_detail(location: str, exc: BaseException, limit: int = 300) -> str:
    """``exc`` as ``Type: text`` for a message: cut to ``limit`` characters, secrets masked, ``location``'s password
    too (a library quotes the part of a URL it could not parse, ``s3://KEY:SECRET@bucket`` as a bucket name)."""
    text = redact_text(str(exc))
    rest = location.partition("://")[2]
    userinfo = rest[: rest.rfind("@")] if "@" in rest else ""
    password = userinfo.partition(":")[2]
    if password:
        text = text.replace(password, REDACTED).replace(urllib.parse.unquote(password), REDACTED)
    return f"{type(exc).__name__}: {text[:limit]}"


def open_fs(location: str, storage_options: Mapping[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem of ``location`` and its path there; a missing package or bad URL is a :class:`DataSourceError`."""
    try:
        return fsspec.core.url_to_fs(expand_path(location), **dict(storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise DataSourceError(
            f"{PARAMETER}={mask_url(location)!r} cannot be opened ({error_detail(location, exc)}). Fix: give a local "
            "folder, a manifest (.csv/.parquet) or an fsspec URL whose package is installed (s3:// needs s3fs)."
        ) from None


def file_version(info: Mapping[str, Any]) -> str:
    """The part of an fsspec ``info`` that changes when a file is rewritten: its ETag, else its mtime."""
    for key in ("ETag", "etag", "md5Hash", "mtime", "LastModified", "last_modified", "created"):
        if info.get(key) is not None:
            return f"{key}:{info[key]}"
    return ""


def describe_access_error(location: str, exc: BaseException) -> DataSourceError:
    """The message for a source that could not be read: missing, or unreadable credentials/permissions."""
    shown = mask_url(location)
    if isinstance(exc, FileNotFoundError):
        return DataSourceError(
            f"{PARAMETER}={shown!r} does not exist. Fix: give an existing folder of class folders "
            "(ROOT/<class>/<image>), a manifest file (.csv/.parquet with path,label[,split]) or a built-in name "
            f"({', '.join(DATASET_NAMES)})."
        )
    if isinstance(exc, PermissionError):
        return DataSourceError(
            f"{PARAMETER}={shown!r} cannot be read: access denied ({type(exc).__name__}). Fix: check the "
            "credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or storage options) and the permissions on that path."
        )
    if "credential" in f"{type(exc).__name__} {exc}".lower():
        return DataSourceError(
            f"{PARAMETER}={shown!r} cannot be read: no usable credentials ({type(exc).__name__}). Fix: set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) where the pipeline runs, or pass them "
            "in the storage options."
        )
    return DataSourceError(
        f"{PARAMETER}={shown!r} cannot be read: {error_detail(location, exc)}. Fix: check the path, the "
        "endpoint and the credentials (storage options or the AWS_* environment)."
    )


def check_source(data: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Fail fast when folder or manifest source ``data`` is missing or unreadable (one request; nothing is listed).

    Raises:
        DataSourceError: the message names the parameter, the path and the fix.
    """
    location = expand_path(data)
    fs, path = open_fs(location, storage_options)
    try:
        fs.info(path)
    except Exception as exc:  # noqa: BLE001 - turned into one message with the fix
        raise describe_access_error(location, exc) from None


def list_source(data: str, storage_options: Mapping[str, Any] | None = None) -> SourceListing:
    """List the files of folder or manifest source ``data`` (a local path or fsspec URL).

    Raises:
        DataSourceError: the source does not exist, cannot be read, or breaks its layout's rules.
    """
    from tasks.domain.image_folder import list_folder
    from tasks.domain.image_manifest import list_manifest

    if is_builtin(data):
        raise DataSourceError(f"{PARAMETER}={data!r} is a built-in idx set: it is staged, not listed.")
    location = expand_path(data)
    fs, path = open_fs(location, storage_options)
    try:
        info = fs.info(path)
    except Exception as exc:  # noqa: BLE001 - turned into one message with the fix
        raise describe_access_error(location, exc) from None
    if info.get("type") == "directory":
        files = list_folder(fs, path, location)
        return SourceListing(source=location, root=location.rstrip("/"), files=files)
    if posixpath.splitext(path)[1].lower() in MANIFEST_SUFFIXES:
        root, files = list_manifest(fs, path, location, storage_options)
        return SourceListing(source=location, root=root, files=files)
    raise DataSourceError(
        f"{PARAMETER}={mask_url(location)!r} is a file but not a manifest. Fix: give a folder of class folders or a "
        f"manifest ending in {' or '.join(MANIFEST_SUFFIXES)} with columns path,label[,split]."
    )
