"""Batch scoring with a registered model version: score one chunk of images, summarise the run.

Plain functions, no Prefect; the scoring flow's tasks wrap them. :func:`score_chunk` runs on Ray workers
with the version :mod:`tasks.domain.scoring_model` resolved and loaded (once per worker process); the
driver sums the chunks' predictions up in a :class:`ScoringSummary` and writes them with
:mod:`tasks.domain.predictions_file`.

Example::

    model = resolve_alias("fashion-mnist-resnet18", "champion", tracking_uri)
    frame = score_chunk(model, read_images("s3://bucket/photos")).frame   # or an idx file, a manifest, ...
    write_predictions(frame, "predictions.parquet")
"""

from __future__ import annotations

import dataclasses
import os

import pandas as pd

from tasks.domain.image_source import ImageSet, ImageSourceError
from tasks.domain.scoring_model import ResolvedModel, load_model

# image_id: the file's path relative to the source (folder) or as the manifest writes it, or the index in an
# idx/.npy file; source_label: the label the source gives the image (its folder's name, the manifest's label).
PREDICTION_COLUMNS = ("image_id", "source_label", "label", "class", "probability", "model_name", "model_version")


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


__all__ = [
    "PREDICTION_COLUMNS",
    "ChunkPredictions",
    "ClassCount",
    "ScoringSummary",
    "class_histogram",
    "score_chunk",
]
