"""The batch-scoring flow: score a set of images with a registered model alias. Runs in the flow-run process.

Deployment ``score-images`` in ``prefect.yaml``. Reads a folder of images (any size and format,
nested class folders allowed), a manifest (``.csv``/``.parquet`` with a ``path`` column), one
image, an idx file (``.gz`` or not) or a ``.npy`` array (local or ``s3://``), resolves the alias (default
``champion``) to one version, scores the images in parallel chunks on prefect-ray's
``RayTaskRunner`` (each worker loads the model once), and writes one predictions file
(``.parquet`` or ``.csv``: image id (the file's path relative to the source), the source's label,
label, class, probability, model name and version)
atomically: a failed run leaves no file that looks complete. A table artifact holds the
class histogram and the model version.

Example::

    score_images(ScoreParams(input_url="t10k-images-idx3-ubyte.gz", output_url="out/predictions.parquet"))
    # prefect deployment run 'score-images/score-images' -p 'params={"input_url": "...", "output_url": "..."}'
"""

from __future__ import annotations

import math
import time
from typing import Any

import pandas as pd
from prefect import flow, get_run_logger
from prefect_ray import RayTaskRunner
from prefect_ray.context import remote_options
from pydantic import BaseModel, ConfigDict, Field, field_validator

from deployments import SCORE_FLOW_NAME as FLOW_NAME  # the name prefect.yaml's deployment refers to
from flows.heartbeats import end_flow_runs_without_joining_heartbeats
from flows.params import NAME_PATTERN
from flows.preflight import current_api_url
from flows.task_runner import cluster_task_runner, local_task_runner, ray_worker_env
from tasks.domain.batch_scoring import ScoringSummary
from tasks.domain.home import PipelineHome
from tasks.domain.predictions_file import check_output_location, output_format
from tasks.domain.promotion import CHAMPION_ALIAS
from tasks.domain.urls import expand_path, mask_url
from tasks.score import read_input, resolve_model, score_images_chunk, write_output

# Before any flow of this module runs: its runs end without waiting up to 1 s for Prefect's heartbeat thread.
end_flow_runs_without_joining_heartbeats()


class ScoreParams(BaseModel):
    """Every parameter of one scoring run, validated before anything starts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_url: str = Field(
        ...,
        min_length=1,
        description="Images: a folder of images (nested class folders allowed), a manifest (.csv/.parquet with a "
        "'path' column), one image, an idx file or a .npy array; a path or an s3:// URL.",
    )
    output_url: str = Field(
        ..., min_length=1, description="Where to write the predictions: a .parquet or .csv path or s3:// URL."
    )
    model_name: str = Field(
        "fashion-mnist-resnet18", pattern=NAME_PATTERN, max_length=200, description="Registered model in MLflow."
    )
    alias: str = Field(CHAMPION_ALIAS, pattern=NAME_PATTERN, max_length=200, description="The model alias to use.")
    overwrite: bool = Field(False, description="Replace output_url if it exists (default: refuse, before scoring).")
    mlflow_tracking_uri: str | None = Field(
        None, description="MLflow server or store (default: $MLFLOW_TRACKING_URI, else the pipeline home's)."
    )
    chunk_size: int = Field(2500, gt=0, le=1_000_000, description="Images per scoring task.")
    num_workers: int = Field(
        2, ge=1, le=4096, description="CPUs of the local Ray (parallel chunks); ignored with ray_address."
    )
    ray_address: str | None = Field(None, description="A Ray cluster (default: a local Ray for this run).")
    storage_options: dict[str, Any] | None = Field(
        None,
        description="fsspec options for s3:// input and output (endpoint, ...); credentials come from the "
        "environment, never from here.",
    )

    @field_validator("storage_options")
    @classmethod
    def _no_credentials(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # Flow parameters are stored in the Prefect database and shown in its UI: no secrets there.
        secret = [k for k in _keys(value) if any(w in k.lower() for w in ("secret", "password", "token", "key"))]
        if secret:
            raise ValueError(
                f"storage_options must not hold credentials ({', '.join(secret)}): set them in the "
                "worker's environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL)."
            )
        return value

    @field_validator("output_url")
    @classmethod
    def _known_format(cls, value: str) -> str:
        output_format(value)
        return value


def _keys(value: Any) -> list[str]:
    if not isinstance(value, dict):
        return []
    return [str(k) for k in value] + [k for v in value.values() for k in _keys(v)]


# What every scoring worker needs (this flow module comes with each task's context): loaded while the
# flow resolves the alias and reads the images, not in each worker's first chunk.
SCORING_WORKER_MODULES = ("flows.score", "mlflow.pyfunc", "torch")


def _task_runner(params: ScoreParams, api_url: str) -> RayTaskRunner:
    if not params.ray_address:
        return local_task_runner(
            preload=SCORING_WORKER_MODULES, worker_env=ray_worker_env(api_url), num_cpus=params.num_workers
        )
    return cluster_task_runner(params.ray_address, {"env_vars": ray_worker_env(api_url)})


@flow(name="score-steps")
def score_steps(params: ScoreParams, input_url: str, output_url: str, tracking_uri: str) -> ScoringSummary:
    """Resolve, read, score in chunks, write: each a task on the Ray cluster."""
    model_future = resolve_model.submit(params.model_name, params.alias, tracking_uri)
    images = read_input.submit(input_url, params.storage_options).result()
    model = model_future.result()
    chunks = math.ceil(len(images) / params.chunk_size)
    started = time.perf_counter()
    with remote_options(num_cpus=1):  # one CPU each: chunks run side by side, one per CPU
        futures = [
            score_images_chunk.submit(model, images.chunk(i * params.chunk_size, (i + 1) * params.chunk_size))
            for i in range(chunks)
        ]
        frames = [future.result() for future in futures]
    score_seconds = time.perf_counter() - started
    predictions = pd.concat(frames, ignore_index=True)
    if len(predictions) != len(images):
        raise RuntimeError(f"Scored {len(predictions)} of {len(images)} images; nothing was written.")
    url = write_output.submit(predictions, output_url, params.storage_options, model, input_url).result()
    return ScoringSummary.of(predictions, model, url, chunks, score_seconds)


@flow(name=FLOW_NAME, validate_parameters=True)
def score_images(params: ScoreParams) -> ScoringSummary:
    """Score a set of images with a registered model alias; write the predictions and a class histogram.

    Args:
        params: see :class:`ScoreParams`; ``input_url`` and ``output_url`` are required.

    Returns:
        The :class:`~tasks.domain.batch_scoring.ScoringSummary`: file written, images, version, histogram.
    """
    logger = get_run_logger()
    api_url = current_api_url()
    tracking_uri = params.mlflow_tracking_uri or PipelineHome.resolve().mlflow_tracking_uri
    input_url, output_url = expand_path(params.input_url), expand_path(params.output_url)
    logger.info(
        "Scoring %s with %s@%s from %s into %s",
        mask_url(input_url),
        params.model_name,
        params.alias,
        mask_url(tracking_uri),
        mask_url(output_url),
    )
    # Before any scoring: an existing output or a folder that cannot be written fails now, not after the work.
    check_output_location(output_url, params.storage_options, params.overwrite)
    steps = score_steps.with_options(task_runner=_task_runner(params, api_url))
    summary = steps(params, input_url, output_url, tracking_uri)
    logger.info(
        "Done: %d images, %s version %s, predictions in %s",
        summary.images,
        summary.model_name,
        summary.model_version,
        mask_url(summary.output_url),
    )
    return summary
