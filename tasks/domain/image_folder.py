"""An image-folder source: ``ROOT/<class>/<file>``, with optional splits and arrival batches. Runs on the driver.

Layouts (every file at the same depth; hidden files and files directly in ROOT are ignored):

* ``ROOT/<class>/<file>``: the snapshot assigns each image's split by its content hash;
* ``ROOT/train/<class>/<file>`` and ``ROOT/test/<class>/<file>``: the splits as given;
* ``ROOT/<batch>/<class>/<file>``: arrivals, one folder per batch (append-only);
* ``ROOT/<batch>/{train,test}/<class>/<file>``: arrivals with splits.

Class names are the class folders' names. Listing reads names, sizes and versions, no content.

Example::

    fs, path = open_fs("s3://bucket/pets")
    files = list_folder(fs, path, "s3://bucket/pets")
"""

from __future__ import annotations

import os
import posixpath

import fsspec

from tasks.domain.data_source import PARAMETER, SPLITS, DataSourceError, ListedFile, describe_access_error, file_version
from tasks.domain.urls import mask_url

LAYOUTS = "ROOT/<class>/<image>, ROOT/{train,test}/<class>/<image> or ROOT/<batch>/<class>/<image>"


def list_folder(fs: fsspec.AbstractFileSystem, path: str, location: str) -> tuple[ListedFile, ...]:
    """Every file of the folder source at ``path`` on ``fs`` (``location`` as the user gave it, for messages).

    Raises:
        DataSourceError: no images, files at different depths, splits in some places only, an empty class
            folder, or fewer than two classes; the message names the path and the fix.
    """
    shown = mask_url(location)
    try:
        found = _walk_local(path) if _is_local(fs) else _walk(fs, path)
    except Exception as exc:  # noqa: BLE001 - one message with the fix
        raise describe_access_error(location, exc) from None
    files: list[ListedFile] = []
    folders: list[str] = []
    for rel, info in sorted(found):
        if not rel or rel.startswith(".") or "/." in rel:  # hidden files and folders
            continue
        parts = rel.split("/")
        if info is None:
            folders.append(rel)
            continue
        if len(parts) < 2:
            continue  # a README or the like beside the class folders
        files.append(_listed(rel, parts, info, shown))
    if not files:
        raise DataSourceError(
            f"{PARAMETER}={shown!r} holds no images in class folders. Fix: lay the images out as {LAYOUTS}."
        )
    depths = {len(f.path.split("/")) for f in files}
    if len(depths) > 1:
        deepest = max(files, key=lambda f: len(f.path.split("/")))
        shallowest = min(files, key=lambda f: len(f.path.split("/")))
        raise DataSourceError(
            f"{PARAMETER}={shown!r} mixes layouts: {shallowest.path!r} and {deepest.path!r} are at different depths. "
            f"Fix: use one layout for every image: {LAYOUTS}."
        )
    with_split = [f for f in files if f.split]
    if with_split and len(with_split) != len(files):
        lacking = next(f for f in files if not f.split)
        raise DataSourceError(
            f"{PARAMETER}={shown!r} has train/test folders, but {lacking.path!r} is in neither. Fix: put every image "
            "under train/ or test/, or none."
        )
    class_depth = depths.pop() - 1
    holding = {posixpath.dirname(f.path) for f in files}
    for folder in folders:
        if len(folder.split("/")) == class_depth and folder not in holding:
            raise DataSourceError(
                f"{PARAMETER}={shown!r}: class folder {folder!r} is empty. Fix: add its images, or remove the folder."
            )
    labels = sorted({f.label for f in files})
    if len(labels) < 2:
        raise DataSourceError(
            f"{PARAMETER}={shown!r} has {len(labels)} class folder(s) ({', '.join(labels)}); a classifier needs at "
            f"least two. Fix: one folder per class: {LAYOUTS}."
        )
    return tuple(files)


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def _walk(fs: fsspec.AbstractFileSystem, path: str) -> list[tuple[str, dict | None]]:
    """(relative path, info) of every file and (relative path, None) of every folder under ``path``."""
    fs.invalidate_cache(path)
    base = path.rstrip("/") + "/"
    return [
        (key[len(base) :] if key.startswith(base) else key, None if info.get("type") == "directory" else info)
        for key, info in fs.find(path, withdirs=True, detail=True).items()
    ]


def _walk_local(path: str) -> list[tuple[str, dict | None]]:
    """:func:`_walk` for a local folder through ``os.scandir``: fsspec's per-file ``info`` costs ~4x the stat."""
    out: list[tuple[str, dict | None]] = []
    if not os.path.isdir(path):
        raise FileNotFoundError(path)
    pending = [("", path)]
    while pending:
        rel_dir, folder = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                if entry.is_dir(follow_symlinks=True):
                    out.append((rel, None))
                    pending.append((rel, entry.path))
                else:
                    stat = entry.stat(follow_symlinks=True)
                    out.append((rel, {"size": stat.st_size, "mtime": stat.st_mtime}))
    return out


def _listed(rel: str, parts: list[str], info: dict, shown: str) -> ListedFile:
    prefix = parts[:-2]
    split = batch = ""
    if len(prefix) == 1:
        split, batch = (prefix[0], "") if prefix[0] in SPLITS else ("", prefix[0])
    elif len(prefix) == 2:
        if prefix[1] not in SPLITS:
            raise DataSourceError(
                f"{PARAMETER}={shown!r}: {rel!r} is 4 levels deep, but its second folder is not train or test. "
                f"Fix: {LAYOUTS}, or ROOT/<batch>/{{train,test}}/<class>/<image>."
            )
        batch, split = prefix
    elif len(prefix) > 2:
        raise DataSourceError(f"{PARAMETER}={shown!r}: {rel!r} is too deep. Fix: lay the images out as {LAYOUTS}.")
    return ListedFile(
        path=rel, label=parts[-2], split=split, batch=batch, size=int(info.get("size") or 0), version=file_version(info)
    )
