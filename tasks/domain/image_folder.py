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
        fs.invalidate_cache(path)
        found = fs.find(path, withdirs=True, detail=True)
    except Exception as exc:  # noqa: BLE001 - one message with the fix
        raise describe_access_error(location, exc) from None
    base = path.rstrip("/") + "/"
    files: list[ListedFile] = []
    folders: list[str] = []
    for key, info in sorted(found.items()):
        rel = key[len(base) :] if key.startswith(base) else key
        parts = rel.split("/")
        if not rel or any(p.startswith(".") for p in parts):
            continue
        if info.get("type") == "directory":
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
