"""Prefect task: distributed training of the tutorial's model with ``trainlib.torch.TorchTrainer``.

The task process is trainlib's driver (a Ray worker in the pipeline, started
with ``num_cpus=0`` so the DDP workers get every CPU). Each committed report is
forwarded to the Prefect task run's log and progress artifact by
:class:`PrefectProgress`, a ``trainlib.Callback``; trainlib itself knows nothing
of Prefect. MLflow tracking is ``trainlib.mlflow.MLflowLogger``. Worker
failures are handled by trainlib's ``FailureConfig`` (restart from the latest
checkpoint), never by Prefect retries.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

import trainlib
from tasks.download import StagedDataset
from tasks.model import train_func
from trainlib.torch import TorchTrainer


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """What one training run does; the flow builds it from its validated parameters.

    Attributes:
        run_name: the run's folder name under ``storage_path`` (and the MLflow run name).
        storage_path: where runs live (local folder or fsspec URL).
        epochs, lr, batch_size: the tutorial's knobs; ``batch_size`` is per worker.
        num_workers, use_gpu: trainlib's ScalingConfig.
        num_to_keep, checkpoint_score_attribute, checkpoint_score_order: trainlib's CheckpointConfig.
        max_failures: trainlib's FailureConfig.
        limit: train on the first ``limit`` training images only (None: all 60,000).
        val_fraction: part of those held out for the per-epoch validation accuracy.
        seed: seeds the model's initial weights and the data split.
        node_cache_dir: where each node keeps its verified copy of the staged data.
        placement_timeout_s: how long to wait for the cluster to grant the workers.
    """

    run_name: str
    storage_path: str
    epochs: int = 1
    lr: float = 1e-3
    batch_size: int = 128
    num_workers: int = 2
    use_gpu: bool = False
    num_to_keep: int | None = 2
    checkpoint_score_attribute: str | None = "val_accuracy"
    checkpoint_score_order: str = "max"
    max_failures: int = 0
    limit: int | None = None
    val_fraction: float = 0.1
    seed: int = 0
    node_cache_dir: str = "~/.cache/trainlib/datasets"
    placement_timeout_s: float = 120.0


@dataclasses.dataclass(frozen=True)
class TrainingOutcome:
    """What training produced, for the evaluate and register steps.

    Attributes:
        run_path: the trainlib run folder (``Result.from_path`` reads it back).
        checkpoint_uri: the checkpoint to evaluate: the best by the score attribute, else the latest.
        metrics: the last report's metrics.
        history: every report's metrics, in order.
        mlflow_run_id: the MLflow run that tracked training.
        seconds: wall time of ``fit()``.
    """

    run_path: str
    checkpoint_uri: str
    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    mlflow_run_id: str | None
    seconds: float


class PrefectProgress(trainlib.Callback):
    """Forwards rank 0's reports to a Prefect logger and a progress artifact (driver side).

    Args:
        logger: a Prefect run logger (``get_run_logger()`` in the task).
        epochs: the number of epochs, for the progress percentage.
        artifact_id: a progress artifact to update after each report, or None.
    """

    def __init__(self, logger: Any, epochs: int, artifact_id: Any = None):
        self.logger = logger
        self.epochs = epochs
        self.artifact_id = artifact_id

    def before_run(self, run: trainlib.RunInfo) -> None:
        resumed = f", resuming from {run.resumed_from}" if run.resumed_from else ""
        self.logger.info("Training run %s: %d worker(s)%s, folder %s%s", run.name, run.world_size,
                         " with GPUs" if run.use_gpu else " on CPUs", run.path, resumed)

    def after_report(self, run: trainlib.RunInfo, report: trainlib.ReportRecord) -> None:
        shown = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in report.metrics.items())
        where = f", checkpoint {report.checkpoint.uri}" if report.checkpoint else ""
        self.logger.info("rank 0 report %d: %s%s", report.step, shown, where)
        if self.artifact_id is not None:
            epoch = report.metrics.get("epoch", report.step - 1)
            try:
                update_progress_artifact(self.artifact_id, progress=min(100.0, 100.0 * (epoch + 1) / self.epochs))
            except Exception as exc:  # noqa: BLE001 - progress display never fails training
                self.logger.warning("Could not update the progress artifact: %s", exc)

    def after_failure(self, run: trainlib.RunInfo, failure: trainlib.WorkerError, will_restart: bool) -> None:
        then = "restarting from the latest checkpoint" if will_restart else "no restarts left"
        self.logger.warning("Worker rank %d failed (%s); %s", failure.rank, failure.cause, then)

    def after_run(self, run: trainlib.RunInfo, result: trainlib.Result) -> None:
        if result.error is None:
            self.logger.info("Training run %s finished: %s", run.name, result.metrics)


def training_config(settings: TrainingSettings, dataset: StagedDataset) -> dict[str, Any]:
    """The ``train_loop_config`` of :func:`tasks.model.train_func` (plain values, nothing secret)."""
    return {
        "dataset": dataset.name, "staged_url": dataset.staged_url, "md5s": dict(dataset.md5s),
        "node_cache_dir": os.path.expanduser(settings.node_cache_dir), "limit": settings.limit,
        "val_fraction": settings.val_fraction, "lr": settings.lr, "batch_size": settings.batch_size,
        "epochs": settings.epochs, "seed": settings.seed,
    }


def run_training(settings: TrainingSettings, dataset: StagedDataset, callbacks: list[trainlib.Callback]
                 ) -> tuple[trainlib.Result, float]:
    """Run the tutorial's training with trainlib; return the result and the seconds ``fit()`` took.

    Raises:
        trainlib.ResourcesUnavailableError: the cluster cannot hold ``num_workers`` workers.
        trainlib.TrainingFailedError: a worker failed more often than ``max_failures`` allows.
    """
    trainer = TorchTrainer(
        train_func,
        train_loop_config=training_config(settings, dataset),
        scaling_config=trainlib.ScalingConfig(num_workers=settings.num_workers, use_gpu=settings.use_gpu,
                                              placement_timeout_s=settings.placement_timeout_s),
        run_config=trainlib.RunConfig(
            name=settings.run_name, storage_path=settings.storage_path, callbacks=callbacks, if_exists="error",
            checkpoint_config=trainlib.CheckpointConfig(
                num_to_keep=settings.num_to_keep, checkpoint_score_attribute=settings.checkpoint_score_attribute,
                checkpoint_score_order=settings.checkpoint_score_order),
            failure_config=trainlib.FailureConfig(max_failures=settings.max_failures),
        ),
    )
    started = time.perf_counter()
    result = trainer.fit()
    return result, time.perf_counter() - started


def chosen_checkpoint(result: trainlib.Result) -> trainlib.Checkpoint:
    """The best kept checkpoint (by the score attribute; newest first without one), else the latest."""
    if result.best_checkpoints:
        return result.best_checkpoints[0][0]
    if result.checkpoint is None:
        raise RuntimeError(f"Training run {result.path} committed no checkpoint: the training function must "
                           "report one with trainlib.report(metrics, checkpoint=...).")
    return result.checkpoint


@task(name="train", cache_policy=NO_CACHE)
def train_model(dataset: StagedDataset, settings: TrainingSettings, tracking_uri: str | None,
                experiment_name: str, tags: dict[str, str] | None = None) -> TrainingOutcome:
    """Train with trainlib on the Ray cluster, tracked in MLflow; return where the result is."""
    from trainlib.mlflow import MLflowLogger

    logger = get_run_logger()
    progress = create_progress_artifact(
        0.0, key=_artifact_key("training-progress", experiment_name),
        description=f"Epochs done of run {settings.run_name}")
    mlflow_logger = MLflowLogger(tracking_uri=tracking_uri, experiment_name=experiment_name,
                                 run_name=settings.run_name, tags=dict(tags or {}))
    result, seconds = run_training(settings, dataset, [mlflow_logger, PrefectProgress(logger, settings.epochs,
                                                                                      progress)])
    checkpoint = chosen_checkpoint(result)
    history = [] if result.metrics_dataframe is None else [
        {k: v for k, v in row.items() if k in ("epoch", "loss", "val_loss", "val_accuracy")}
        for row in result.metrics_dataframe.to_dict("records")]
    logger.info("fit() took %.1f s; evaluating checkpoint %s (MLflow run %s)", seconds, checkpoint.uri,
                mlflow_logger.run_id)
    return TrainingOutcome(run_path=result.path, checkpoint_uri=checkpoint.uri, metrics=dict(result.metrics or {}),
                           history=history, mlflow_run_id=mlflow_logger.run_id, seconds=seconds)


def _artifact_key(prefix: str, name: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) from free text."""
    cleaned = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    return f"{prefix}-{'-'.join(filter(None, cleaned.split('-')))}"
