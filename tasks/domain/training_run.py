"""One training run of the pipeline: its settings, the trainer that runs it, and what it produced. Runs on the driver.

The driver is the pipeline's train task process; ``TorchTrainer.fit()`` starts the DDP
workers that run :func:`tasks.domain.training_loop.train_func`. Worker failures are handled
by trainlib's ``FailureConfig``; a run started again under the same name continues from its
latest committed checkpoint (``if_exists="resume"``).

Example::

    fit = run_training(settings, staged, callbacks=[])
    outcome = training_outcome(fit, mlflow_run_id=None, architecture=settings.recipe.architecture)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from typing import Any

import trainlib
from tasks.domain.data_version import DataVersion
from tasks.domain.image_spec import ImageSpec
from tasks.domain.progress import ProgressSink
from tasks.domain.recipe import Recipe
from tasks.domain.staging import StagedDataset
from tasks.domain.urls import expand_path, join_url

RUN_RECORD_FILE = "trainlib_run.json"  # a run folder's record (docs/storage.md): its train_loop_config among others
SAME_RUN_KEYS = ("dataset", "recipe")  # what a run of the same name must share to be continued or reused

logger = logging.getLogger("trainlib")

HISTORY_KEYS = ("epoch", "loss", "val_loss", "val_accuracy")


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """What one training run does; the flow builds it from its validated parameters (their defaults live there).

    Attributes:
        run_name: the run's folder name under ``storage_path`` (and the MLflow run name).
        storage_path: where runs live (local folder or fsspec URL).
        epochs, batch_size: the tutorial's knobs; ``batch_size`` is per worker.
        recipe: optimizer, learning rate and schedule, regularisation, augmentation.
        num_workers, use_gpu, placement_strategy: trainlib's ScalingConfig.
        num_to_keep, checkpoint_score_attribute, checkpoint_score_order: trainlib's CheckpointConfig.
        max_failures: trainlib's FailureConfig.
        limit: train on the first ``limit`` training images only (None: all 60,000).
        val_fraction: part of those held out for the per-epoch validation accuracy.
        seed: seeds the model's initial weights and the data split.
        node_cache_dir: where each node keeps its verified copy of the staged data.
        placement_timeout_s: how long to wait for the cluster to grant the workers.
        init_weights_uri: the initial weights of a warm start (:mod:`tasks.domain.warm_start`); None: random.
    """

    run_name: str
    storage_path: str
    node_cache_dir: str
    epochs: int
    recipe: Recipe
    batch_size: int
    num_workers: int
    use_gpu: bool
    num_to_keep: int | None
    checkpoint_score_attribute: str | None
    max_failures: int
    limit: int | None
    seed: int
    placement_timeout_s: float
    val_fraction: float = 0.1
    checkpoint_score_order: str = "max"
    placement_strategy: str = "PACK"
    init_weights_uri: str | None = None


@dataclasses.dataclass(frozen=True)
class TrainingOutcome:
    """What training produced, for the evaluate and register steps.

    Attributes:
        run_path: the trainlib run folder (``Result.from_path`` reads it back).
        checkpoint_uri: the checkpoint to evaluate: the best by the score attribute, else the latest.
        metrics: the last report's metrics.
        history: every report's metrics (:data:`HISTORY_KEYS`), in order.
        mlflow_run_id: the MLflow run that tracked training.
        seconds: wall time of ``fit()``.
        architecture: the network the checkpoint holds (the recipe's).
        image_spec: the classes and input channels of a network trained on a snapshot (None: an idx set).
    """

    run_path: str
    checkpoint_uri: str
    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    mlflow_run_id: str | None
    seconds: float
    architecture: str
    image_spec: ImageSpec | None = None


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What :func:`run_training` got from trainlib.

    Attributes:
        result: trainlib's result.
        seconds: the wall time of ``fit()`` (0 when ``reused``).
        reused: the run had finished before, so it was read back and nothing was trained.
    """

    result: trainlib.Result
    seconds: float
    reused: bool


def training_config(settings: TrainingSettings, dataset: StagedDataset | DataVersion) -> dict[str, Any]:
    """The ``train_loop_config`` of :func:`train_func`: plain values, the same for every attempt, nothing secret."""
    if isinstance(dataset, DataVersion):
        data = {
            "snapshot_uri": dataset.snapshot_uri,
            "data_digest": dataset.digest,
            "image_spec": dataset.spec.record(),
        }
    else:
        data = {"dataset": dataset.name, "staged_url": dataset.staged_url, "md5s": dict(dataset.md5s)}
    return {
        **data,
        "node_cache_dir": expand_path(settings.node_cache_dir),
        "limit": settings.limit,
        "val_fraction": settings.val_fraction,
        "recipe": settings.recipe.record(),
        "batch_size": settings.batch_size,
        "epochs": settings.epochs,
        "seed": settings.seed,
        "init_weights_uri": settings.init_weights_uri,
    }


def run_training(
    settings: TrainingSettings,
    dataset: StagedDataset | DataVersion,
    callbacks: list[trainlib.Callback],
    progress: ProgressSink | None = None,
) -> FitResult:
    """Run the tutorial's training with trainlib, rank 0 telling ``progress`` where it is within the epoch.

    A run folder of the same name that exists already is continued from its latest committed
    checkpoint, so a retried pipeline run does not start training over; a finished one is
    read back, not trained again.

    Raises:
        trainlib.ResourcesUnavailableError: the cluster cannot hold ``num_workers`` workers.
        trainlib.TrainingFailedError: a worker failed more often than ``max_failures`` allows.
    """
    # Here, not at the top: the flow process builds TrainingSettings for every run, and one that skips an unchanged
    # week imports neither torch nor Ray.
    from tasks.domain.training_loop import train_func
    from trainlib.torch import TorchTrainer

    trainer = TorchTrainer(
        functools.partial(train_func, progress=progress),
        train_loop_config=training_config(settings, dataset),
        scaling_config=trainlib.ScalingConfig(
            num_workers=settings.num_workers,
            use_gpu=settings.use_gpu,
            placement_strategy=settings.placement_strategy,
            placement_timeout_s=settings.placement_timeout_s,
        ),
        run_config=trainlib.RunConfig(
            name=settings.run_name,
            storage_path=settings.storage_path,
            callbacks=callbacks,
            if_exists="resume",
            checkpoint_config=trainlib.CheckpointConfig(
                num_to_keep=settings.num_to_keep,
                checkpoint_score_attribute=settings.checkpoint_score_attribute,
                checkpoint_score_order=settings.checkpoint_score_order,
            ),
            failure_config=trainlib.FailureConfig(max_failures=settings.max_failures),
        ),
    )
    check_same_training(join_url(settings.storage_path, settings.run_name), training_config(settings, dataset))
    started = time.perf_counter()
    try:
        result = trainer.fit()
    except trainlib.RunExistsError:  # raised only for a FINISHED run under if_exists="resume"
        logger.warning("Training run %s finished earlier: using its result, not training again.", settings.run_name)
        return FitResult(trainlib.Result.from_path(join_url(settings.storage_path, settings.run_name)), 0.0, True)
    return FitResult(result, time.perf_counter() - started, False)


def chosen_checkpoint(result: trainlib.Result) -> trainlib.Checkpoint:
    """The best kept checkpoint (by the score attribute; the newest without one), else the latest."""
    if result.best_checkpoints:
        return result.best_checkpoints[-1][0]  # Ray Train's order: best last
    if result.checkpoint is None:
        frame = result.metrics_dataframe
        named = [] if frame is None or "checkpoint" not in frame else [c for c in frame["checkpoint"] if c]
        if named:
            raise RuntimeError(
                f"Training run {result.path} committed checkpoints ({', '.join(named[-3:])}), but none is left in "
                "its folder: they were deleted. Train again under a new run name (--run-name, or leave it unset), "
                "or delete that run folder and run again."
            )
        raise RuntimeError(
            f"Training run {result.uri} committed no checkpoint: the training function must "
            "report one with trainlib.report(metrics, checkpoint=...)."
        )
    return result.checkpoint


def check_same_training(run_url: str, config: dict[str, Any]) -> None:
    """Refuse to continue or reuse the run at ``run_url`` when it was made with another data set or recipe: its
    checkpoints hold another network (continuing fails with ``size mismatch``, reusing evaluates the wrong model).

    Raises:
        ValueError: naming the run, what differs and the fix.
    """
    import fsspec

    try:
        with fsspec.open(join_url(run_url, RUN_RECORD_FILE), "r") as f:
            recorded = json.load(f).get("train_loop_config") or {}
    except FileNotFoundError:
        return  # a new run
    except (OSError, ValueError, AttributeError):
        return  # unreadable: trainlib's own checks report it when it opens the run
    now = json.loads(json.dumps({key: config.get(key) for key in SAME_RUN_KEYS}, default=str))
    differences = [
        f"{key} {recorded[key]!r} there, {now[key]!r} now"
        for key in SAME_RUN_KEYS
        if key in recorded and recorded[key] != now[key]
    ]
    if differences:
        raise ValueError(
            f"Training run {run_url} was made with another data set or recipe ({'; '.join(differences)}), so it is "
            "neither continued nor reused. Pass another --run-name (or none: each pipeline run then gets its own), "
            "or delete that run folder."
        )


def training_outcome(
    fit: FitResult, mlflow_run_id: str | None, architecture: str, image_spec: ImageSpec | None = None
) -> TrainingOutcome:
    """The :class:`TrainingOutcome` of a finished ``fit()``: the checkpoint to evaluate and the metrics history."""
    result, seconds = fit.result, fit.seconds
    checkpoint = chosen_checkpoint(result)
    history = (
        []
        if result.metrics_dataframe is None
        else [
            {k: v for k, v in row.items() if k in HISTORY_KEYS} for row in result.metrics_dataframe.to_dict("records")
        ]
    )
    return TrainingOutcome(
        run_path=result.uri,
        checkpoint_uri=checkpoint.uri,
        metrics=dict(result.metrics or {}),
        history=history,
        mlflow_run_id=mlflow_run_id,
        seconds=seconds,
        architecture=architecture,
        image_spec=image_spec,
    )
