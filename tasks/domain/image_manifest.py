"""A manifest source: a CSV or Parquet file with columns ``path,label[,split][,batch]``. Runs on the driver.

Paths are relative to the manifest's folder (never outside it) or URLs (``s3://...``). Each file's
size and version are read from its storage. Class names are the ``label`` values.

Example::

    fs, path = open_fs("s3://bucket/pets/manifest.csv")
    root, files = list_manifest(fs, path, "s3://bucket/pets/manifest.csv", None)
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec

from tasks.domain.data_source import (
    PARAMETER,
    SPLITS,
    DataSourceError,
    ListedFile,
    describe_access_error,
    error_detail,
    file_version,
    open_fs,
    resolve,
)
from tasks.domain.urls import mask_url

REQUIRED_COLUMNS = ("path", "label")
INFO_THREADS = 16  # sizes of remote files are read concurrently (one request each)


def list_manifest(
    fs: fsspec.AbstractFileSystem, path: str, location: str, storage_options: Mapping[str, Any] | None
) -> tuple[str, tuple[ListedFile, ...]]:
    """The root (the manifest's folder) and every file the manifest at ``path`` names.

    Raises:
        DataSourceError: a missing column, an empty manifest, a path outside the manifest's folder, a bad split
            value, a listed file that does not exist, or fewer than two labels.
    """
    import pandas as pd

    shown = mask_url(location)
    try:
        with fs.open(path, "rb") as handle:
            table = pd.read_parquet(handle) if path.lower().endswith(".parquet") else pd.read_csv(handle, dtype=str)
    except Exception as exc:  # noqa: BLE001 - one message with the fix
        if isinstance(exc, (FileNotFoundError, PermissionError)):
            raise describe_access_error(location, exc) from None
        raise DataSourceError(
            f"{PARAMETER}={shown!r}: the manifest cannot be parsed ({error_detail(location, exc, 200)}). "
            "Fix: a CSV with a header row, or a Parquet file, with columns path,label[,split]."
        ) from None
    missing = [c for c in REQUIRED_COLUMNS if c not in table.columns]
    if missing:
        raise DataSourceError(
            f"{PARAMETER}={shown!r}: the manifest lacks column(s) {', '.join(missing)} (it has "
            f"{', '.join(map(str, table.columns)) or 'none'}). Fix: columns path,label[,split], one row per image."
        )
    if table.empty:
        raise DataSourceError(f"{PARAMETER}={shown!r}: the manifest has no rows. Fix: one row per image.")
    root = location.rsplit("/", 1)[0] if "/" in location else "."
    rows = []
    for number, row in enumerate(table.to_dict("records"), start=2):
        rel = str(row["path"]).strip()
        label = str(row["label"]).strip()
        split = str(row.get("split") or "").strip() if "split" in table.columns else ""
        split = "" if split == "nan" else split
        if not rel or not label or label == "nan":
            raise DataSourceError(f"{PARAMETER}={shown!r}, row {number}: empty path or label. Fix: fill both.")
        if split and split not in SPLITS:
            raise DataSourceError(
                f"{PARAMETER}={shown!r}, row {number}: split {split!r} is not train or test. Fix: train, test or empty."
            )
        if "://" not in rel:
            normal = posixpath.normpath(rel)
            if rel.startswith("/") or normal == ".." or normal.startswith("../"):
                raise DataSourceError(
                    f"{PARAMETER}={shown!r}, row {number}: path {rel!r} is outside the manifest's folder {root!r}. "
                    "Fix: paths relative to the manifest's folder (no '..', no absolute paths), or full URLs."
                )
            rel = normal
        batch = str(row.get("batch") or "") if "batch" in table.columns else ""
        rows.append((rel, label, split, "" if batch == "nan" else batch))
    labels = {label for _, label, _, _ in rows}
    if len(labels) < 2:
        raise DataSourceError(
            f"{PARAMETER}={shown!r}: the manifest has {len(labels)} label(s); a classifier needs at least two. "
            "Fix: label the images with their classes."
        )

    def info(rel: str) -> dict[str, Any]:
        url = resolve(root, rel)
        file_fs, file_path = (fs, fs._strip_protocol(url)) if "://" not in rel else open_fs(url, storage_options)
        try:
            return file_fs.info(file_path)
        except FileNotFoundError:
            raise DataSourceError(
                f"{PARAMETER}={shown!r}: listed file {mask_url(url)!r} does not exist. Fix: add it, or remove its row."
            ) from None
        except Exception as exc:  # noqa: BLE001 - one message with the fix
            raise describe_access_error(url, exc) from None

    with ThreadPoolExecutor(INFO_THREADS) as pool:
        infos = list(pool.map(info, [rel for rel, _, _, _ in rows]))
    files = tuple(
        ListedFile(
            path=rel, label=label, split=split, batch=batch, size=int(i.get("size") or 0), version=file_version(i)
        )
        for (rel, label, split, batch), i in zip(rows, infos, strict=True)
    )
    return root, files
