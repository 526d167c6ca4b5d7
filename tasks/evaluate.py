"""Prefect task: evaluate the trained checkpoint on the test split; log to MLflow and Prefect.

Runs on a Ray worker in the pipeline. Loads the checkpoint the training step
chose (best, else latest) as the tutorial's last step does, scores it with
``tasks.evaluation``, logs test metrics and two pictures (confusion matrix,
learning curve) to the training's MLflow run, and leaves a markdown report and
a per-class table as Prefect artifacts.
"""

from __future__ import annotations

import json
import time
import os
import tempfile

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

import trainlib
from tasks.datasets import fetch_dataset, load_fashion_mnist_split
from tasks.download import StagedDataset
from tasks.evaluation import EvaluationReport, evaluate_model, plot_confusion_matrix, plot_learning_curve
from tasks.model import CLASS_NAMES, load_model
from tasks.train import TrainingOutcome, _artifact_key

MLFLOW_ARTIFACT_DIR = "evaluation"


def evaluate_checkpoint(checkpoint_uri: str, dataset: StagedDataset, cache_dir: str,
                        test_limit: int | None) -> EvaluationReport:
    """Load the model from ``checkpoint_uri`` and score it on the staged test split (plain function)."""
    files = fetch_dataset(dataset.name, os.path.expanduser(cache_dir), mirrors=[dataset.staged_url],
                          md5s=dataset.md5s)
    images, labels = load_fashion_mnist_split(files.folder, train=False, limit=test_limit)
    with trainlib.Checkpoint.from_uri(checkpoint_uri).as_directory() as folder:
        model = load_model(folder)
    return evaluate_model(model, images, labels, CLASS_NAMES[dataset.name])


def log_evaluation_to_mlflow(report: EvaluationReport, history: list[dict], run_id: str,
                             tracking_uri: str | None) -> list[str]:
    """Log test metrics, the pictures and the report's JSON to MLflow run ``run_id``; return the file names."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric


    client = MlflowClient(tracking_uri=tracking_uri)
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in report.metrics().items()])
    with tempfile.TemporaryDirectory() as folder:
        names = [
            os.path.basename(plot_confusion_matrix(report, os.path.join(folder, "confusion_matrix.png"))),
            os.path.basename(plot_learning_curve(history, os.path.join(folder, "learning_curve.png"))),
        ]
        with open(os.path.join(folder, "test_report.json"), "w") as f:
            json.dump({"accuracy": report.accuracy, "loss": report.loss, "num_images": report.num_images,
                       "per_class_accuracy": report.per_class_accuracy,
                       "confusion_matrix": report.confusion_matrix}, f, indent=1)
        with open(os.path.join(folder, "test_report.md"), "w") as f:
            f.write(report.markdown())
        names += ["test_report.json", "test_report.md"]
        client.log_artifacts(run_id, folder, artifact_path=MLFLOW_ARTIFACT_DIR)
    return names


@task(name="evaluate", cache_policy=NO_CACHE, retries=1, retry_delay_seconds=5)
def evaluate(training: TrainingOutcome, dataset: StagedDataset, cache_dir: str, test_limit: int | None,
             tracking_uri: str | None, model_name: str) -> EvaluationReport:
    """Score the trained model on the test split, record the scores in MLflow and in Prefect artifacts."""
    logger = get_run_logger()
    report = evaluate_checkpoint(training.checkpoint_uri, dataset, cache_dir, test_limit)
    logger.info("Test accuracy %.2f%%, loss %.4f on %d images (checkpoint %s)", 100 * report.accuracy, report.loss,
                report.num_images, training.checkpoint_uri)
    if training.mlflow_run_id:
        names = log_evaluation_to_mlflow(report, training.history, training.mlflow_run_id, tracking_uri)
        logger.info("Logged test metrics and %s to MLflow run %s", ", ".join(names), training.mlflow_run_id)
    create_markdown_artifact(
        report.markdown(f"Test-set evaluation of {model_name}")
        + f"\nCheckpoint: `{training.checkpoint_uri}`  \nMLflow run: `{training.mlflow_run_id}`\n",
        key=_artifact_key("evaluation", model_name), description="Test accuracy, loss and per-class accuracy")
    create_table_artifact(
        [{"label": i, "class": name, "accuracy": round(report.per_class_accuracy[name], 4),
          "images": sum(report.confusion_matrix[i])} for i, name in enumerate(report.class_names)],
        key=_artifact_key("per-class-accuracy", model_name), description="Test accuracy per class")
    return report
