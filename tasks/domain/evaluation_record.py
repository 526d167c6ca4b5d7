"""What the evaluation leaves in the training's MLflow run: test metrics, pictures, the report. Runs on the driver.

Example::

    log_evaluation_to_mlflow(report, training.history, training.mlflow_run_id, tracking_uri)
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from tasks.domain.evaluation import EvaluationReport
from tasks.domain.plots import plot_confusion_matrix, plot_learning_curve

MLFLOW_ARTIFACT_DIR = "evaluation"


def log_evaluation_to_mlflow(
    report: EvaluationReport, history: list[dict], run_id: str, tracking_uri: str | None
) -> list[str]:
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
            json.dump(
                {
                    "accuracy": report.accuracy,
                    "loss": report.loss,
                    "num_images": report.num_images,
                    "per_class_accuracy": report.per_class_accuracy,
                    "confusion_matrix": report.confusion_matrix,
                },
                f,
                indent=1,
            )
        with open(os.path.join(folder, "test_report.md"), "w") as f:
            f.write(report.markdown())
        names += ["test_report.json", "test_report.md"]
        client.log_artifacts(run_id, folder, artifact_path=MLFLOW_ARTIFACT_DIR)
    return names
