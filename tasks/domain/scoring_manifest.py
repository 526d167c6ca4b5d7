"""Reads the images a scoring manifest lists: a ``.csv`` or ``.parquet`` table with a ``path`` column.

Runs where the scoring flow's read step runs (a Ray worker), called by ``image_source.read_images``.
Each ``path`` is relative to the manifest's folder (on the manifest's filesystem: a local folder or
an S3 prefix) or a URL (``s3://...``, ``https://...``; the manifest's ``storage_options`` apply to
URLs of its own protocol). A path may not leave the manifest's folder (``../``) or be absolute: the
manifest stays valid wherever its folder is copied. An optional ``label`` column is carried to the
predictions. An image's id is its ``path`` as written.

Example::

    images = read_manifest(data, fs, "bucket/batch/manifest.csv", "s3://bucket/batch/manifest.csv", options)
"""

from __future__ import annotations

import io
import os
import posixpath
import stat
from collections.abc import Mapping
from typing import Any

import fsspec

from tasks.domain.image_source import ImageSet, ImageSourceError, checked_image

PATH_COLUMN, LABEL_COLUMN = "path", "label"


def read_manifest(data: bytes, fs: Any, path: str, url: str, storage_options: Mapping[str, Any]) -> ImageSet:
    """The images listed by the manifest ``data``, read from ``path`` on ``fs`` (``url``: its masked form).

    Raises:
        ImageSourceError: the manifest is unreadable, lacks the ``path`` column, or a row's path is empty,
            absolute, outside the manifest's folder, missing or not an image; the message names the row.
    """
    import pandas as pd

    try:
        frame = pd.read_parquet(io.BytesIO(data)) if path.lower().endswith(".parquet") else _read_csv(data)
    except Exception as exc:  # noqa: BLE001 - a table that pandas cannot read becomes one message
        raise ImageSourceError(f"{url} is not a readable manifest ({type(exc).__name__}: {exc}).") from None
    if PATH_COLUMN not in frame.columns:
        raise ImageSourceError(
            f"The manifest {url} has no column {PATH_COLUMN!r} (its columns: {[str(c) for c in frame.columns]}). "
            f"A manifest lists one image per row: {PATH_COLUMN!r} (relative to the manifest, or a URL) and "
            f"optionally {LABEL_COLUMN!r}."
        )
    folder = posixpath.dirname(path)
    protocol = _protocol(fs)
    targets = [_target(value, row, folder, protocol, url) for row, value in enumerate(frame[PATH_COLUMN])]
    ids = tuple(str(value).strip() for value in frame[PATH_COLUMN])
    if protocol in ("file", "local"):  # a pipe would hang the read, a device never end
        for row, target in enumerate(targets):
            if "://" not in target and os.path.exists(target) and not stat.S_ISREG(os.stat(target).st_mode):
                raise ImageSourceError(
                    f"{url}, row {row}: {ids[row]} is not a regular file (a pipe, device or socket), which scoring "
                    "does not read."
                )
    contents = _fetch(fs, targets, protocol, storage_options)
    files = []
    for row, (name, target) in enumerate(zip(ids, targets, strict=True)):
        data = contents.get(target)
        if isinstance(data, BaseException) or data is None:
            what = (
                "does not exist" if isinstance(data, FileNotFoundError) or data is None else f"cannot be read ({data})"
            )
            raise ImageSourceError(f"{url}, row {row}: {name} {what}. Fix the manifest's {PATH_COLUMN!r} or the file.")
        files.append(checked_image(data, f"row {row} ({name})", url))
    labels = None
    if LABEL_COLUMN in frame.columns:
        labels = tuple(None if pd.isna(v) or str(v).strip() == "" else str(v).strip() for v in frame[LABEL_COLUMN])
    return ImageSet(url, ids, files=tuple(files), labels=labels)


def _read_csv(data: bytes) -> Any:
    import pandas as pd

    return pd.read_csv(io.BytesIO(data), dtype={PATH_COLUMN: str, LABEL_COLUMN: str}, keep_default_na=False)


def _protocol(fs: Any) -> str:
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def _target(value: Any, row: int, folder: str, protocol: str, url: str) -> str:
    """Row ``row``'s file: a URL as written, else its path on the manifest's filesystem."""
    text = "" if value is None else str(value).strip()
    if not text or text.lower() == "nan":
        raise ImageSourceError(f"{url}, row {row}: the {PATH_COLUMN!r} is empty. Give each row an image's path.")
    if "://" in text:
        return text
    joined = posixpath.normpath(posixpath.join(folder, text))
    if text.startswith(("/", "\\")) or not (joined == folder or joined.startswith(folder.rstrip("/") + "/")):
        raise ImageSourceError(
            f"{url}, row {row}: the path {text!r} is outside the manifest's folder. Write paths relative to the "
            "manifest (without '..' or a leading '/'), or as URLs (s3://..., https://...)."
        )
    return joined


def _fetch(fs: Any, targets: list[str], protocol: str, storage_options: Mapping[str, Any]) -> dict[str, Any]:
    """Each target's bytes (or the exception reading it), fetched together per filesystem."""
    local = [t for t in targets if "://" not in t]
    contents: dict[str, Any] = dict(fs.cat(local, on_error="return")) if local else {}
    for target in dict.fromkeys(t for t in targets if "://" in t):
        scheme = target.split("://", 1)[0]
        options = dict(storage_options) if scheme == protocol or scheme in (fs.protocol or ()) else {}
        try:
            url_fs, url_path = fsspec.core.url_to_fs(target, **options)
            contents[target] = url_fs.cat_file(url_path)
        except Exception as exc:  # noqa: BLE001 - reported with the row that names it
            contents[target] = exc
    return contents
