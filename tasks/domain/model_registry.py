"""The MLflow model registry as the pipeline uses it: register a version once per run, set aliases. Runs on the driver.

The new version always gets alias ``challenger``; ``champion`` moves to it only when its
test accuracy beats the current champion's (:func:`tasks.domain.promotion.decide_promotion`).
The decision is kept as tags on the new version. Calling it again for the same MLflow run
registers nothing new.

Example::

    registration = register_and_promote(training, report, "fashion-mnist-resnet18", tracking_uri)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import trainlib
from tasks.domain.evaluation import EvaluationReport
from tasks.domain.network import MODEL_FILE, build_model, to_inputs
from tasks.domain.promotion import (
    ACCURACY_TAG,
    CHALLENGER_ALIAS,
    CHAMPION_ALIAS,
    PromotionDecision,
    decide_promotion,
    parse_accuracy,
)
from tasks.domain.training_run import TrainingOutcome


@dataclasses.dataclass(frozen=True)
class Registration:
    """The registered version and what happened to the aliases."""

    model_name: str
    version: str
    champion_version: str
    decision: PromotionDecision


def find_version_of_run(client: Any, model_name: str, run_id: str) -> str | None:
    """The version of ``model_name`` already registered from MLflow run ``run_id``, if any."""
    versions = client.search_model_versions(f"name = '{model_name}'")
    mine = [v for v in versions if v.run_id == run_id]
    return max(mine, key=lambda v: int(v.version)).version if mine else None


def current_champion(client: Any, model_name: str) -> tuple[str | None, float | None]:
    """``(version, test accuracy)`` of the current champion; ``(None, None)`` when there is none.

    The accuracy comes from the version's ``test_accuracy`` tag, else from its run's metric.
    """
    from mlflow.exceptions import MlflowException

    try:
        champion = client.get_model_version_by_alias(model_name, CHAMPION_ALIAS)
    except MlflowException:
        return None, None
    accuracy = parse_accuracy((champion.tags or {}).get(ACCURACY_TAG))
    if accuracy is None and champion.run_id:
        try:
            accuracy = parse_accuracy(str(client.get_run(champion.run_id).data.metrics.get(ACCURACY_TAG)))
        except MlflowException:
            accuracy = None
    return champion.version, accuracy


def _register_model(checkpoint_uri: str, model_name: str, run_id: str, tracking_uri: str | None) -> None:
    """Log the checkpoint's model to run ``run_id`` and register it as a new version of ``model_name``."""
    import torch

    from trainlib.mlflow import log_model

    example = to_inputs(torch.zeros(1, 28, 28, dtype=torch.uint8)).numpy()
    log_model(trainlib.Checkpoint.from_uri(checkpoint_uri), build_model(), state_dict_file=MODEL_FILE, input_example=example,
              registered_model_name=model_name, run_id=run_id, tracking_uri=tracking_uri)


def register_and_promote(training: TrainingOutcome, report: EvaluationReport, model_name: str,
                         tracking_uri: str | None, extra_tags: dict[str, str] | None = None) -> Registration:
    """Register the model (once per run), tag it, set ``challenger`` and maybe ``champion`` ."""
    from mlflow import MlflowClient

    if not training.mlflow_run_id:
        raise ValueError("The training step has no MLflow run id, so there is no run to register the model from. "
                         "Check the MLflow tracking URI of the pipeline.")
    client = MlflowClient(tracking_uri=tracking_uri)
    version = find_version_of_run(client, model_name, training.mlflow_run_id)
    if version is None:
        _register_model(training.checkpoint_uri, model_name, training.mlflow_run_id, tracking_uri)
        version = find_version_of_run(client, model_name, training.mlflow_run_id)
        if version is None:
            raise RuntimeError(f"MLflow registered no version of {model_name!r} for run {training.mlflow_run_id}.")
    champion_version, champion_accuracy = current_champion(client, model_name)
    if champion_version == version:  # a retry after the aliases were set
        champion_version, champion_accuracy = None, None
    decision = decide_promotion(report.accuracy, champion_accuracy, champion_version)
    tags = {ACCURACY_TAG: f"{report.accuracy:.6f}", "test_loss": f"{report.loss:.6f}",
            "checkpoint": training.checkpoint_uri, **decision.tags(), **(extra_tags or {})}
    for key, value in tags.items():
        client.set_model_version_tag(model_name, version, key, value)
    client.set_registered_model_alias(model_name, CHALLENGER_ALIAS, version)
    if decision.promote:
        client.set_registered_model_alias(model_name, CHAMPION_ALIAS, version)
    return Registration(model_name=model_name, version=version,
                        champion_version=version if decision.promote else (champion_version or ""),
                        decision=decision)
