"""Prefect task: evaluate the trained checkpoint on the test split; record it in MLflow and Prefect.

Runs on a Ray worker in the pipeline. The work is
:func:`tasks.domain.champion_comparison.compare_with_champion` (the new checkpoint and the current
champion scored on the same test images) and
:func:`tasks.domain.evaluation_record.log_evaluation_to_mlflow`; this wrapper adds the log,
a retry, a markdown report and a per-class table as Prefect artifacts.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from tasks.artifacts import artifact_key
from tasks.domain.champion_comparison import Comparison, compare_with_champion
from tasks.domain.cpu_threads import use_assigned_cpus
from tasks.domain.data_version import DataVersion
from tasks.domain.evaluation_record import log_evaluation_to_mlflow
from tasks.domain.snapshot_evaluation import compare_on_snapshot
from tasks.domain.staging import StagedDataset
from tasks.domain.training_run import TrainingOutcome

EVALUATE_TIMEOUT_S = 30 * 60


@task(name="evaluate", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5, timeout_seconds=EVALUATE_TIMEOUT_S)
def evaluate(
    training: TrainingOutcome,
    dataset: StagedDataset | DataVersion,
    cache_dir: str,
    test_limit: int | None,
    tracking_uri: str,
    model_name: str,
) -> Comparison:
    """Score the trained model and the current champion on the test split; record it in MLflow and Prefect."""
    logger = get_run_logger()
    use_assigned_cpus()
    if isinstance(dataset, DataVersion):
        comparison = compare_on_snapshot(training, dataset, cache_dir, test_limit, model_name, tracking_uri)
    else:
        comparison = compare_with_champion(training, dataset, cache_dir, test_limit, model_name, tracking_uri)
    report, champion = comparison.report, comparison.champion
    logger.info(
        "Test accuracy %.2f%%, loss %.4f on %d images (checkpoint %s)",
        100 * report.accuracy,
        report.loss,
        report.num_images,
        training.checkpoint_uri,
    )
    if champion.version is None:
        versus = "no champion yet"
    elif champion.accuracy is None:
        versus = f"champion version {champion.version} could not be scored: {champion.error}"
    else:
        how = (
            "recorded at its registration; its labels for the probe images match" if champion.recorded else "scored now"
        )
        versus = f"champion version {champion.version}: {champion.accuracy:.2%} on the same images ({how})"
    logger.info("Current champion of %s: %s (test data md5 %s)", model_name, versus, comparison.test_data_md5)
    if training.mlflow_run_id:
        names = log_evaluation_to_mlflow(report, training.history, training.mlflow_run_id, tracking_uri)
        logger.info("Logged test metrics and %s to MLflow run %s", ", ".join(names), training.mlflow_run_id)
    create_markdown_artifact(
        report.markdown(f"Test-set evaluation of {model_name}")
        + f"\n* current champion: {versus}\n* test data md5: `{comparison.test_data_md5}`\n"
        + f"\nCheckpoint: `{training.checkpoint_uri}`  \nMLflow run: `{training.mlflow_run_id}`\n",
        key=artifact_key("evaluation", model_name),
        description="Test accuracy, loss and per-class accuracy",
    )
    create_table_artifact(
        [
            {
                "label": i,
                "class": name,
                "accuracy": round(report.per_class_accuracy[name], 4),
                "images": sum(report.confusion_matrix[i]),
            }
            for i, name in enumerate(report.class_names)
        ],
        key=artifact_key("per-class-accuracy", model_name),
        description="Test accuracy per class",
    )
    return comparison
