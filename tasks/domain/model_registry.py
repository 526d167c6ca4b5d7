"""The register step: register the checkpoint as a model version once per run, tag it, set the aliases.

Runs in the register task's process (a Ray worker, not one of training's DDP workers). :func:`register_and_promote`
packages the checkpoint as the self-contained model (:mod:`tasks.domain.model_package`), registers it
once per MLflow run (a retry finds the version it made), sets ``challenger`` and moves ``champion`` when
:func:`tasks.domain.promotion.decide_promotion` and the gates say so, from the :class:`Comparison` of the
evaluate step (:mod:`tasks.domain.champion_comparison`). Both accuracies, the margin and the test data's
md5 are kept as tags on the new version.

Example::

    registration = register_and_promote(training, comparison, card, "fashion-mnist-resnet18", tracking_uri,
                                        min_margin=0.002)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tasks.domain.champion import champion_version
from tasks.domain.champion_comparison import Comparison, checkpoint_network
from tasks.domain.gates import GateSettings, evaluate_gates
from tasks.domain.model_card import ModelCard
from tasks.domain.model_package import log_and_register
from tasks.domain.promotion import (
    ACCURACY_PER_CLASS_TAG,
    ACCURACY_TAG,
    CHALLENGER_ALIAS,
    CHAMPION_ALIAS,
    DEFAULT_MIN_MARGIN,
    PROBE_TAG,
    TEST_DATA_MD5_TAG,
    TEST_IMAGES_TAG,
    PromotionDecision,
    apply_gates,
    decide_promotion,
    per_class_tag,
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


def register_and_promote(
    training: TrainingOutcome,
    comparison: Comparison,
    card: ModelCard,
    model_name: str,
    tracking_uri: str,
    min_margin: float = DEFAULT_MIN_MARGIN,
    extra_tags: dict[str, str] | None = None,
    gates: GateSettings | None = None,
) -> Registration:
    """Register the model (once per run), tag it, set ``challenger`` and maybe ``champion``.

    The champion moves only if it is still the version the evaluate step scored; if another
    run moved it meanwhile, this run's challenger does not take it. Nor does it when one of ``gates``
    fails (:mod:`tasks.domain.gates`); every gate's outcome is a ``gate.<name>`` tag on the version.
    """
    from mlflow import MlflowClient

    if not training.mlflow_run_id:
        raise ValueError(
            "The training step has no MLflow run id, so there is no run to register the model from. "
            "Check the MLflow tracking URI of the pipeline."
        )
    report, champion = comparison.report, comparison.champion
    card = dataclasses.replace(card, test_accuracy=report.accuracy, architecture=training.architecture)
    client = MlflowClient(tracking_uri=tracking_uri)
    version = find_version_of_run(client, model_name, training.mlflow_run_id)
    current = champion_version(client, model_name)
    if current is not None and current == version:  # a retry after the aliases were set: already the champion
        decision = decide_promotion(report.accuracy, champion.accuracy, champion.version, min_margin, champion.error)
    elif current != champion.version:
        decision = PromotionDecision(
            False,
            report.accuracy,
            None,
            current,
            f"the champion moved from version {champion.version} to {current} during this run: champion kept "
            "(run the pipeline again to compare against the new champion)",
            min_margin,
        )
    else:
        decision = decide_promotion(report.accuracy, champion.accuracy, champion.version, min_margin, champion.error)
    challenger_classes = [report.per_class_accuracy[name] for name in report.class_names]
    decision = apply_gates(
        decision,
        evaluate_gates(
            gates or GateSettings(),
            challenger_classes,
            champion.per_class_accuracy,
            report.class_names,
            report.accuracy,
            comparison.newest_slice,
        ),
    )
    tags = {
        ACCURACY_TAG: f"{report.accuracy:.6f}",
        ACCURACY_PER_CLASS_TAG: per_class_tag(challenger_classes),
        "test_loss": f"{report.loss:.6f}",
        TEST_IMAGES_TAG: str(report.num_images),
        TEST_DATA_MD5_TAG: comparison.test_data_md5,
        "checkpoint": training.checkpoint_uri,
        **({PROBE_TAG: comparison.probe} if comparison.probe else {}),
        **decision.tags(),
        **(extra_tags or {}),
    }
    if version is None:  # the version is created with its tags
        version = log_and_register(
            checkpoint_network(training.checkpoint_uri, training.architecture, training.image_spec),
            card,
            model_name,
            training.mlflow_run_id,
            tracking_uri,
            tags=tags,
        ).version
    else:  # a retry: the version exists, perhaps without (all of) its tags
        for key, value in tags.items():
            client.set_model_version_tag(model_name, version, key, value)
    client.set_registered_model_alias(model_name, CHALLENGER_ALIAS, version)
    if decision.promote:
        client.set_registered_model_alias(model_name, CHAMPION_ALIAS, version)
    return Registration(
        model_name=model_name,
        version=version,
        champion_version=version if decision.promote or current == version else (current or ""),
        decision=decision,
    )


def record_gates_on_run(decision: PromotionDecision, run_id: str | None, tracking_uri: str) -> None:
    """Each gate's outcome as a ``gate.<name>`` tag on the training's MLflow run (beside the version's)."""
    from mlflow import MlflowClient

    if not run_id or not decision.gates:
        return
    client = MlflowClient(tracking_uri=tracking_uri)
    for gate in decision.gates:
        client.set_tag(run_id, *gate.tag())
    client.set_tag(run_id, "promotion_decision", "promoted" if decision.promote else "kept_champion")
