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
    places: dict[str, tuple[str, str, str, int]] = {}  # folder -> (label, split, batch, depth), once per folder
    for rel, found_file in sorted(found):
        if not rel or rel.startswith(".") or "/." in rel:  # hidden files and folders
            continue
        if found_file is None:
            folders.append(rel)
            continue
        folder = rel.rpartition("/")[0]
        if not folder:
            continue  # a README or the like beside the class folders
        place = places.get(folder)
        if place is None:
            place = places[folder] = _place(folder, rel, shown)
        label, split, batch, _ = place
        files.append(ListedFile(rel, label, split, batch, found_file[0], found_file[1]))
    if not files:
        raise DataSourceError(
            f"{PARAMETER}={shown!r} holds no images in class folders. Fix: lay the images out as {LAYOUTS}."
        )
    depths = {place[3] for place in places.values()}
    if len(depths) > 1:
        deepest = max(places, key=lambda f: places[f][3])
        shallowest = min(places, key=lambda f: places[f][3])
        raise DataSourceError(
            f"{PARAMETER}={shown!r} mixes layouts: images in {shallowest!r} and in {deepest!r} are at different "
            f"depths. Fix: use one layout for every image: {LAYOUTS}."
        )
    split_or_not = {bool(place[1]) for place in places.values()}
    if len(split_or_not) > 1:
        lacking = next(f for f, place in places.items() if not place[1])
        raise DataSourceError(
            f"{PARAMETER}={shown!r} has train/test folders, but {lacking!r} is in neither. Fix: put every image "
            "under train/ or test/, or none."
        )
    class_depth = depths.pop()
    for folder in folders:
        if len(folder.split("/")) == class_depth and folder not in places:
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


Found = list[tuple[str, tuple[int, str] | None]]


def _walk(fs: fsspec.AbstractFileSystem, path: str) -> Found:
    """(relative path, (size, version)) of every file and (relative path, None) of every folder under ``path``."""
    fs.invalidate_cache(path)
    base = path.rstrip("/") + "/"
    # s3fs's find lists the root folder itself too: taken for a folder of the source, it would be an "empty class
    # folder" in the train/test and batch layouts.
    return [
        (
            key[len(base) :],
            None if info.get("type") == "directory" else (int(info.get("size") or 0), file_version(info)),
        )
        for key, info in fs.find(path, withdirs=True, detail=True).items()
        if key.startswith(base)
    ]


def _walk_local(path: str) -> Found:
    """:func:`_walk` for a local folder through ``os.scandir``: fsspec's per-file ``info`` costs ~4x the stat."""
    out: Found = []
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
                    out.append((rel, (stat.st_size, f"mtime:{stat.st_mtime}")))
    return out


def _place(folder: str, rel: str, shown: str) -> tuple[str, str, str, int]:
    """(label, split, batch, depth) of the images in ``folder`` (``rel``: one of them, for messages)."""
    parts = folder.split("/")
    prefix = parts[:-1]
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
    return parts[-1], split, batch, len(parts)
