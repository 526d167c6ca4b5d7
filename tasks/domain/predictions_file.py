"""The predictions file of a batch-scoring run: its format, the check of its location, the atomic write, the read.

Runs on the scoring flow's side: :func:`check_output_location` before any image is scored (the flow-run
process), :func:`write_predictions` in the write task once every chunk is scored (a Ray worker). The whole
file is written under a temporary name and renamed (local) or put in one request (object stores), so a
failed run never leaves a file that looks complete. :func:`read_predictions` reads one back (tests, users).

Example::

    check_output_location("predictions.parquet")
    write_predictions(frame, "predictions.parquet")
    read_predictions("predictions.parquet")
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Mapping
from typing import Any

import fsspec
import pandas as pd

from tasks.domain.urls import mask_url
from tasks.domain.writable import folder_write_error

OUTPUT_FORMATS = {".parquet": "parquet", ".csv": "csv"}


def output_format(output_url: str) -> str:
    """``parquet`` or ``csv`` from the output's extension.

    Raises:
        ValueError: any other extension.
    """
    extension = os.path.splitext(output_url.rstrip("/"))[1].lower()
    if extension not in OUTPUT_FORMATS:
        raise ValueError(f"output_url={output_url!r} must end in .parquet or .csv (the predictions' format).")
    return OUTPUT_FORMATS[extension]


class OutputLocationError(ValueError):
    """The predictions cannot be written where asked (checked before any scoring); the message says why."""


def check_output_location(
    output_url: str, storage_options: Mapping[str, Any] | None = None, overwrite: bool = False
) -> None:
    """Before scoring: refuse an existing output (unless ``overwrite``) and a local folder that cannot be written.

    A local folder is checked by creating and removing a probe file in it (its folders made first): permissions,
    a read-only mount and a full quota all show. Object stores are checked at the write.

    Raises:
        OutputLocationError: naming the output and the fix.
    """
    fs, path = fsspec.core.url_to_fs(output_url, **dict(storage_options or {}))
    shown = mask_url(output_url)
    if fs.exists(path) and not overwrite:
        raise OutputLocationError(
            f"The output {shown} exists already; scoring does not replace it unless told to. Pass another "
            "output_url, or overwrite=True (--overwrite) to replace it."
        )
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol not in ("file", "local"):
        return
    exc = folder_write_error(os.path.dirname(os.path.abspath(path)))
    if exc is not None:
        raise OutputLocationError(
            f"Cannot write the output {shown}: {type(exc).__name__}: {exc.strerror or exc}. Pass an output_url in a "
            "folder this process can write (checked before scoring, so nothing was scored)."
        ) from None


def write_predictions(
    predictions: pd.DataFrame, output_url: str, storage_options: Mapping[str, Any] | None = None
) -> str:
    """Write the predictions to ``output_url`` (``.parquet`` or ``.csv``; local or fsspec URL) atomically.

    Returns the URL written. Local files appear by rename; object stores get one whole PUT.
    """
    fmt = output_format(output_url)
    buffer = io.BytesIO()
    if fmt == "parquet":
        predictions.to_parquet(buffer, index=False)
    else:
        predictions.to_csv(buffer, index=False)
    data = buffer.getvalue()
    fs, path = fsspec.core.url_to_fs(output_url, **dict(storage_options or {}))
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex}.part"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    else:
        fs.pipe_file(path, data)  # one PUT: the object appears whole or not at all
    return output_url


def read_predictions(url: str, storage_options: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Read a predictions file written by :func:`write_predictions` (ids as strings, versions as strings)."""
    with fsspec.open(url, "rb", **dict(storage_options or {})) as f:
        data = f.read()
    if output_format(url) == "parquet":
        return pd.read_parquet(io.BytesIO(data))
    return pd.read_csv(io.BytesIO(data), dtype={"image_id": str, "source_label": str, "model_version": str})
