"""Prefect task: distributed training of the tutorial's model with trainlib, tracked in MLflow.

Runs on a Ray worker in the pipeline, started with ``num_cpus=0`` so the DDP workers get
every CPU; this process is trainlib's driver. The work is
:func:`tasks.domain.training_run.run_training`; this wrapper adds MLflow tracking
(``trainlib.mlflow.MLflowLogger``, which copies only the best checkpoint to MLflow, once, at
the end), the data set (or the run's snapshot and validation report) as the MLflow run's input, the Prefect log, a link artifact to the MLflow
run and the ``trainlib.training.failed`` event. Worker failures are handled by trainlib's
``FailureConfig``, never by Prefect retries; a retried flow run continues the same training
run (its name is stable), and a finished one is not trained again.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact
from prefect.cache_policies import NO_CACHE

from tasks.artifacts import artifact_key
from tasks.domain.data_version import DataVersion, log_snapshot_input, log_validation_report
from tasks.domain.lineage import dataset_identity, log_dataset_input
from tasks.domain.mlflow_runs import find_run_id, run_page_url
from tasks.domain.progress import ProgressSink
from tasks.domain.snapshot import read_snapshot
from tasks.domain.staging import StagedDataset
from tasks.domain.training_run import TrainingOutcome, TrainingSettings, run_training, training_outcome
from tasks.domain.validation_report import ValidationReport
from tasks.events import emit_training_failed
from tasks.prefect_callback import PrefectLogCallback


@task(name="train", cache_policy=NO_CACHE)
def train_model(
    dataset: StagedDataset | DataVersion,
    settings: TrainingSettings,
    tracking_uri: str,
    experiment_name: str,
    tags: dict[str, str] | None = None,
    progress: ProgressSink | None = None,
    data_report: ValidationReport | None = None,
) -> TrainingOutcome:
    """Train with trainlib on the Ray cluster, tracked in MLflow; return where the result is."""
    from trainlib.mlflow import MLflowLogger

    logger = get_run_logger()
    mlflow_logger = MLflowLogger(
        tracking_uri=tracking_uri,
        experiment_name=experiment_name,
        run_name=settings.run_name,
        tags=dict(tags or {}),
        log_checkpoints="best",
    )
    try:
        fit = run_training(settings, dataset, [mlflow_logger, PrefectLogCallback(logger)], progress)
    except Exception as exc:
        emit_training_failed(settings.run_name, exc)
        raise
    run_id = find_run_id(tracking_uri, experiment_name, settings.run_name) if fit.reused else mlflow_logger.run_id
    snapshot_data = isinstance(dataset, DataVersion)
    outcome = training_outcome(fit, run_id, settings.recipe.architecture, dataset.spec if snapshot_data else None)
    if run_id and not fit.reused and snapshot_data:
        log_snapshot_input(run_id, read_snapshot(dataset.snapshot_uri), dataset, tracking_uri)
        if data_report is not None:
            log_validation_report(run_id, data_report, tracking_uri)
    elif run_id and not fit.reused:
        log_dataset_input(run_id, dataset_identity(dataset), tracking_uri)
    if run_id:
        create_link_artifact(
            run_page_url(tracking_uri, run_id),
            link_text=f"MLflow run {settings.run_name}",
            key=artifact_key("mlflow-run", experiment_name),
            description="The training's MLflow run: metrics, checkpoints, evaluation, model",
        )
    logger.info(
        "fit() took %.1f s%s; evaluating checkpoint %s (MLflow run %s)",
        fit.seconds,
        " (finished earlier, not trained again)" if fit.reused else "",
        outcome.checkpoint_uri,
        run_id,
    )
    return outcome
