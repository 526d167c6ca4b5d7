"""Prefect tasks of the batch-scoring flow: resolve the alias, read the images, score a chunk, write the file.

Each task runs on a Ray worker (prefect-ray's RayTaskRunner). The work is in
:mod:`tasks.domain.scoring_model`, :mod:`tasks.domain.image_source`, :mod:`tasks.domain.batch_scoring`
and :mod:`tasks.domain.predictions_file`; these wrappers add
retries for repeatable registry I/O, the log, and the class-histogram table artifact.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from tasks.artifacts import artifact_key
from tasks.domain.batch_scoring import class_histogram, score_chunk
from tasks.domain.cpu_threads import use_assigned_cpus
from tasks.domain.image_source import ImageSet, read_images
from tasks.domain.predictions_file import write_predictions
from tasks.domain.scoring_model import ModelAliasError, ResolvedModel, requirement_mismatches, resolve_alias
from tasks.domain.urls import mask_url

SCORE_CHUNK_TIMEOUT_S = 30 * 60


def _retry_unless_missing(task: Any, task_run: Any, state: Any) -> bool:
    # A missing model or alias will still be missing in five seconds; a network blip may not be.
    try:
        state.result()
    except ModelAliasError:
        return False
    except Exception:  # noqa: BLE001 - anything else is worth one more try
        return True
    return False


@task(
    name="resolve-model",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=5,
    retry_condition_fn=_retry_unless_missing,
)
def resolve_model(model_name: str, alias: str, tracking_uri: str) -> ResolvedModel:
    """The version ``alias`` points to now; every chunk then uses that version."""
    model = resolve_alias(model_name, alias, tracking_uri)
    logger = get_run_logger()
    logger.info("Scoring with %s@%s = version %s (%s)", model_name, alias, model.version, mask_url(tracking_uri))
    mismatches = requirement_mismatches(model)
    if mismatches:
        logger.warning(
            "Version %s was registered with packages this Python does not have: %s. Its predictions "
            "may differ; install them to match.",
            model.version,
            "; ".join(mismatches),
        )
    return model


@task(name="read-images", cache_policy=NO_CACHE)
def read_input(input_url: str, storage_options: dict[str, Any] | None) -> ImageSet:
    """Read and check every image of the input before any scoring starts."""
    images = read_images(input_url, storage_options)
    get_run_logger().info("Read %d images from %s", len(images), mask_url(input_url))
    return images


@task(name="score-chunk", cache_policy=NO_CACHE, timeout_seconds=SCORE_CHUNK_TIMEOUT_S)
def score_images_chunk(model: ResolvedModel, images: ImageSet) -> Any:
    """Predictions of one chunk (the model is loaded once per worker process, not per chunk or image)."""
    use_assigned_cpus()
    chunk = score_chunk(model, images)
    how = "loaded the model" if chunk.loaded_model else "reused the model already loaded"
    get_run_logger().info(
        "Scored %d images (ids %s..%s); worker pid %d %s",
        len(chunk.frame),
        images.ids[0],
        images.ids[-1],
        chunk.worker_pid,
        how,
    )
    return chunk.frame


@task(name="write-predictions", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5)
def write_output(
    predictions: Any, output_url: str, storage_options: dict[str, Any] | None, model: ResolvedModel, input_url: str
) -> str:
    """Write the predictions file atomically and leave the class histogram as a table artifact."""
    url = write_predictions(predictions, output_url, storage_options)
    histogram = class_histogram(predictions)
    create_table_artifact(
        [
            {
                "label": row.label,
                "class": row.class_name,
                "images": row.images,
                "share": round(row.share, 4),
                "model": f"{model.name} v{model.version}",
            }
            for row in histogram
        ],
        key=artifact_key("scoring-histogram", model.name),
        description=f"Predicted classes of {len(predictions)} images from {mask_url(input_url)} by {model.name} "
        f"version {model.version} (alias {model.alias}); predictions in {mask_url(url)}",
    )
    get_run_logger().info("Wrote %d predictions to %s", len(predictions), mask_url(url))
    return url
