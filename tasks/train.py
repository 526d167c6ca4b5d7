"""Prefect task: distributed training of the tutorial's model with trainlib, tracked in MLflow.

Runs on a Ray worker in the pipeline, started with ``num_cpus=0`` so the DDP workers get
every CPU; this process is trainlib's driver. The work is
:func:`tasks.domain.training_run.run_training`; this wrapper adds MLflow tracking
(``trainlib.mlflow.MLflowLogger``, which copies only the best checkpoint to MLflow, once, at
the end), the data set as the MLflow run's input, and the Prefect log. Worker failures are handled by
trainlib's ``FailureConfig``, never by Prefect retries.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from tasks.domain.lineage import dataset_identity, log_dataset_input
from tasks.domain.staging import StagedDataset
from tasks.domain.training_run import TrainingOutcome, TrainingSettings, run_training, training_outcome
from tasks.prefect_callback import PrefectLogCallback


@task(name="train", cache_policy=NO_CACHE)
def train_model(dataset: StagedDataset, settings: TrainingSettings, tracking_uri: str | None,
                experiment_name: str, tags: dict[str, str] | None = None) -> TrainingOutcome:
    """Train with trainlib on the Ray cluster, tracked in MLflow; return where the result is."""
    from trainlib.mlflow import MLflowLogger

    logger = get_run_logger()
    mlflow_logger = MLflowLogger(tracking_uri=tracking_uri, experiment_name=experiment_name,
                                 run_name=settings.run_name, tags=dict(tags or {}), log_checkpoints="best")
    result, seconds = run_training(settings, dataset, [mlflow_logger, PrefectLogCallback(logger)])
    outcome = training_outcome(result, seconds, mlflow_logger.run_id)
    if outcome.mlflow_run_id and tracking_uri:
        log_dataset_input(outcome.mlflow_run_id, dataset_identity(dataset), tracking_uri)
    logger.info("fit() took %.1f s; evaluating checkpoint %s (MLflow run %s)", seconds, outcome.checkpoint_uri,
                outcome.mlflow_run_id)
    return outcome
