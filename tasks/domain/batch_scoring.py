"""Batch scoring with a registered model version: resolve an alias, score chunks, summarise, write atomically.

Plain functions, no Prefect; the scoring flow's tasks wrap them. ``resolve_alias``
runs once per flow run (every chunk then uses the same pinned version, even if the
alias moves meanwhile); ``score_chunk`` runs on Ray workers and loads the model
once per worker process (cached), never per image; ``write_predictions`` writes
the whole file under a temporary name and renames it (local) or puts it in one
request (object stores), so a failed run never leaves a file that looks complete.

Example::

    model = resolve_alias("fashion-mnist-resnet18", "champion", tracking_uri)
    frame = score_chunk(model, read_images("s3://bucket/photos")).frame   # or an idx file, a manifest, ...
    write_predictions(frame, "predictions.parquet")
"""

from __future__ import annotations

import dataclasses
import io
import os
import threading
import uuid
from collections.abc import Mapping
from typing import Any

import fsspec
import pandas as pd

from tasks.domain.champion import alias_version, registry_call
from tasks.domain.image_source import ImageSet, ImageSourceError
from tasks.domain.urls import mask_url
from tasks.domain.writable import folder_write_error

# image_id: the file's path relative to the source (folder) or as the manifest writes it, or the index in an
# idx/.npy file; source_label: the label the source gives the image (its folder's name, the manifest's label).
PREDICTION_COLUMNS = ("image_id", "source_label", "label", "class", "probability", "model_name", "model_version")
OUTPUT_FORMATS = {".parquet": "parquet", ".csv": "csv"}


class ModelAliasError(LookupError):
    """The registered model or its alias does not exist; the message says how to create it."""


@dataclasses.dataclass(frozen=True)
class ResolvedModel:
    """A registered version picked by alias.

    Attributes:
        name: the registered model.
        alias: the alias asked for (e.g. ``champion``).
        version: the version the alias pointed to when resolved.
        tracking_uri: the MLflow server or store holding it.
        source: where the version's files are (MLflow's download URI); empty: ask the registry.
    """

    name: str
    alias: str
    version: str
    tracking_uri: str
    source: str = ""

    @property
    def model_uri(self) -> str:
        """The pinned version's URI (not the alias, which may move during a run)."""
        return f"models:/{self.name}/{self.version}"

    @property
    def load_uri(self) -> str:
        """What the workers load: the files themselves when known. A ``models:/`` URI would make each
        worker open the registry's store first (~1.4 s of CPU for a SQLite one: SQLAlchemy and its checks)."""
        return self.source or self.model_uri


def resolve_alias(model_name: str, alias: str, tracking_uri: str) -> ResolvedModel:
    """The version ``alias`` of ``model_name`` points to.

    Raises:
        ModelAliasError: no such registered model, or it has no such alias; the message names both
            and how to create a champion.
        DanglingAliasError: the alias points at a deleted version (named).
        RegistryUnavailableError: the registry stayed locked (never read as "no such model").
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri)
    # Retried while the registry is locked; an alias pointing at a deleted version names it (tasks.domain.champion).
    version = alias_version(client, model_name, alias)
    if version is None:
        try:
            model = registry_call(f"reading model {model_name!r}", lambda: client.get_registered_model(model_name))
            known = sorted(model.aliases)
            what = f"Registered model {model_name!r} has no alias {alias!r} (its aliases: {known or 'none'})"
        except MlflowException:
            what = f"There is no registered model {model_name!r}"
        raise ModelAliasError(
            f"{what} in MLflow at {mask_url(tracking_uri)}. Create a champion by running the training pipeline "
            "(`python -m flows.main` or the fashion-mnist-retrain deployment), which registers a version and "
            f"promotes it; or point the alias at an existing version: MlflowClient().set_registered_model_alias("
            f"{model_name!r}, {alias!r}, '<version>')."
        )
    return ResolvedModel(
        name=model_name,
        alias=alias,
        version=str(version.version),
        tracking_uri=tracking_uri,
        source=client.get_model_version_download_uri(model_name, version.version),
    )


def requirement_mismatches(model: ResolvedModel) -> list[str]:
    """The model's pinned requirements (``requirements.txt``) that this Python's packages do not satisfy.

    MLflow checks this on every load by scanning every installed package (~1.7 s of CPU); the
    scoring flow checks once, here, and its workers load with that check off.
    """
    from importlib.metadata import PackageNotFoundError, version

    import mlflow
    from packaging.requirements import InvalidRequirement, Requirement

    from trainlib.mlflow import using_tracking_uri

    with using_tracking_uri(model.tracking_uri):
        path = mlflow.artifacts.download_artifacts(artifact_uri=f"{model.load_uri.rstrip('/')}/requirements.txt")
    problems = []
    with open(path) as f:
        for line in f:
            line = line.split("#")[0].strip()
            if not line or line.startswith("-"):
                continue
            try:
                requirement = Requirement(line)
            except InvalidRequirement:
                continue
            try:
                installed = version(requirement.name)
            except PackageNotFoundError:
                problems.append(f"{line} (not installed)")
                continue
            if requirement.specifier and not requirement.specifier.contains(installed.split("+")[0], prereleases=True):
                problems.append(f"{line} (installed: {installed})")
    return problems


_LOADED: dict[tuple[str, str], Any] = {}
_LOAD_LOCK = threading.Lock()


def load_model(model: ResolvedModel) -> tuple[Any, bool]:
    """The pyfunc model of ``model``, loaded once per process (Ray reuses worker processes across chunks).

    Returns the model and whether this call loaded it (False: it came from this process's cache).
    """
    import mlflow

    from trainlib.mlflow import using_tracking_uri

    key = (model.tracking_uri, model.model_uri)
    with _LOAD_LOCK:
        loaded_now = key not in _LOADED
        if loaded_now:
            with using_tracking_uri(model.tracking_uri):
                # The requirements were checked once for the run (requirement_mismatches): not again per worker.
                _LOADED[key] = mlflow.pyfunc.load_model(model.load_uri, suppress_warnings=True)
        return _LOADED[key], loaded_now


@dataclasses.dataclass(frozen=True)
class ChunkPredictions:
    """One chunk's predictions, and whether the worker had to load the model for it.

    Attributes:
        frame: one row per image, the columns of ``PREDICTION_COLUMNS``.
        loaded_model: True when this worker process loaded the model for this chunk (its first).
        worker_pid: the process that scored the chunk.
    """

    frame: pd.DataFrame
    loaded_model: bool
    worker_pid: int


def score_chunk(model: ResolvedModel, images: ImageSet) -> ChunkPredictions:
    """Predictions for ``images`` with the pinned version of ``model``.

    Raises:
        ImageSourceError: the model refused one image (e.g. a file whose header read but whose pixels do
            not decode); the message names the file.
    """
    pyfunc, loaded_now = load_model(model)
    try:
        out = pyfunc.predict(images.model_input())
    except ValueError as exc:  # the model's ImageInputError (a ValueError) names the row; name the file instead
        row = getattr(exc, "row", None)
        if row is None or not 0 <= row < len(images):
            raise
        reason = str(exc).removeprefix(f"Row {row}: ")  # the row within this chunk would mislead
        raise ImageSourceError(f"{images.source}: {images.ids[row]}: {reason}") from None
    frame = pd.DataFrame(
        {
            "image_id": list(images.ids),
            "source_label": list(images.labels) if images.labels is not None else [None] * len(images),
            "label": out["label"].astype("int64"),
            "class": out["class"].astype(str),
            "probability": out["probability"].astype("float64"),
            "model_name": model.name,
            "model_version": model.version,
        },
        columns=list(PREDICTION_COLUMNS),
    )
    return ChunkPredictions(frame=frame, loaded_model=loaded_now, worker_pid=os.getpid())


@dataclasses.dataclass(frozen=True)
class ClassCount:
    """One row of the class histogram."""

    label: int
    class_name: str
    images: int
    share: float


def class_histogram(predictions: pd.DataFrame) -> list[ClassCount]:
    """How many images went to each predicted class, most frequent first."""
    counts = predictions.groupby(["label", "class"]).size().sort_values(ascending=False)
    total = int(counts.sum())
    return [ClassCount(int(label), str(name), int(n), n / total) for (label, name), n in counts.items()]


@dataclasses.dataclass(frozen=True)
class ScoringSummary:
    """What one batch-scoring run did: the scoring flow's result.

    Attributes:
        output_url: the predictions file written.
        images: images scored (one row each in the file).
        chunks: scoring tasks the images were split into.
        model_name: the registered model.
        model_version: the version that scored every image.
        alias: the alias resolved to that version.
        score_seconds: wall time of the scoring tasks (reading and writing excluded).
        histogram: images per predicted class, most frequent first.
    """

    output_url: str
    images: int
    chunks: int
    model_name: str
    model_version: str
    alias: str
    score_seconds: float
    histogram: tuple[ClassCount, ...]

    @classmethod
    def of(
        cls, predictions: pd.DataFrame, model: ResolvedModel, output_url: str, chunks: int, score_seconds: float
    ) -> ScoringSummary:
        """The summary of ``predictions`` scored by ``model`` in ``chunks`` tasks and written to ``output_url``."""
        return cls(
            output_url=output_url,
            images=len(predictions),
            chunks=chunks,
            model_name=model.name,
            model_version=model.version,
            alias=model.alias,
            score_seconds=score_seconds,
            histogram=tuple(class_histogram(predictions)),
        )


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


__all__ = [
    "PREDICTION_COLUMNS",
    "ChunkPredictions",
    "ClassCount",
    "ModelAliasError",
    "ResolvedModel",
    "class_histogram",
    "load_model",
    "check_output_location",
    "output_format",
    "read_predictions",
    "requirement_mismatches",
    "resolve_alias",
    "score_chunk",
    "write_predictions",
]
