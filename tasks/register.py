"""Prefect task: register the trained model in MLflow and apply the champion/challenger rule.

Runs on a Ray worker in the pipeline. The work is
:func:`tasks.domain.model_registry.register_and_promote` (a retry never registers the same
run twice); this wrapper adds retries, the log, a markdown artifact with the decision and the
``trainlib.model.promoted`` event.
"""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from tasks.artifacts import artifact_key
from tasks.domain.champion_comparison import Comparison
from tasks.domain.gates import GateSettings
from tasks.domain.model_card import ModelCard
from tasks.domain.model_registry import Registration, record_gates_on_run, register_and_promote
from tasks.domain.promotion import CHALLENGER_ALIAS
from tasks.domain.training_run import TrainingOutcome
from tasks.events import emit_model_promoted

REGISTER_TIMEOUT_S = 15 * 60


@task(name="register", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=5, timeout_seconds=REGISTER_TIMEOUT_S)
def register(
    training: TrainingOutcome,
    comparison: Comparison,
    card: ModelCard,
    model_name: str,
    tracking_uri: str,
    min_margin: float,
    extra_tags: dict[str, str] | None = None,
    gates: GateSettings | None = None,
) -> Registration:
    """Register the model version, set ``challenger``, promote to ``champion`` if it beats it by ``min_margin``
    and passes every configured gate."""
    logger = get_run_logger()
    registration = register_and_promote(
        training, comparison, card, model_name, tracking_uri, min_margin, extra_tags, gates
    )
    decision, report = registration.decision, comparison.report
    logger.info(
        "Registered %s version %s as %r; %s", model_name, registration.version, CHALLENGER_ALIAS, decision.reason
    )
    for gate in decision.gates:
        logger.info("Gate %s: %s: %s", gate.name, gate.outcome, gate.detail)
    record_gates_on_run(decision, training.mlflow_run_id, tracking_uri)
    create_table_artifact(
        [{"gate": g.name, "outcome": g.outcome, "detail": g.detail} for g in decision.gates],
        key=artifact_key("promotion-gates", model_name),
        description=f"Promotion gates of {model_name} version {registration.version}",
    )
    if decision.promote:
        emit_model_promoted(
            model_name, registration.version, report.accuracy, decision.champion_version, decision.reason
        )
    create_markdown_artifact(
        f"# Model registry: {model_name}\n\n"
        f"* new version **{registration.version}** has alias `{CHALLENGER_ALIAS}`\n"
        f"* decision: **{'promoted to champion' if decision.promote else 'champion kept'}**: {decision.reason}\n"
        f"* champion now: version **{registration.champion_version}**\n"
        f"* test accuracy: {report.accuracy:.2%} (previous champion on the same {report.num_images} images: "
        f"{'none' if decision.champion_accuracy is None else f'{decision.champion_accuracy:.2%}'}; margin "
        f"{'n/a' if decision.margin is None else f'{decision.margin:+.4f}'}, required >= {decision.min_margin:.4f})\n"
        f"* test data md5: `{comparison.test_data_md5}`\n"
        + "".join(f"* gate `{g.name}`: **{g.outcome}**: {g.detail}\n" for g in decision.gates)
        + f"* recipe: `{card.recipe.get('name', 'unknown')}`; data set md5 `{card.dataset.digest}`\n",
        key=artifact_key("model-registry", model_name),
        description="Champion/challenger decision",
    )
    return registration
