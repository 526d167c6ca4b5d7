"""Promotion gates on a real MLflow registry (SQLite store): a challenger that beats the champion overall but
lets one class collapse is registered, not promoted, with the gate named in its tags and its MLflow run."""

from __future__ import annotations

import pytest
import torch
from model_helpers import evaluate_and_register, needs_data, tiny_trained_network

pytestmark = [pytest.mark.integration, needs_data]

MODEL_NAME = "gates-test"


@pytest.mark.timeout(600)
def test_a_collapsed_class_is_registered_but_not_promoted_and_the_gate_is_named(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from tasks.domain.gates import GateSettings
    from tasks.domain.model_registry import record_gates_on_run

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    weak = tiny_trained_network(steps=6)
    report1, _, first = evaluate_and_register(tmp_path, uri, MODEL_NAME, weak, "weak", 0.0)
    assert first.decision.promote
    # The champion's best class never predicted by an otherwise much better network: a win overall.
    best = max(report1.class_names, key=report1.per_class_accuracy.get)
    collapsed = tiny_trained_network(steps=24)
    with torch.no_grad():
        collapsed.fc.bias[report1.class_names.index(best)] -= 1e4

    gates = GateSettings(max_class_drop=0.1, min_accuracy=0.5)
    report2, champion, refused = evaluate_and_register(
        tmp_path, uri, MODEL_NAME, collapsed, "collapsed", 0.0, gates=gates
    )
    assert report2.accuracy > report1.accuracy and report2.per_class_accuracy[best] == 0.0
    # The champion's per-class accuracies were its recorded ones (its probe matched), as exact as the report's.
    assert champion.recorded and champion.per_class_accuracy[report1.class_names.index(best)] == pytest.approx(
        report1.per_class_accuracy[best], abs=1e-6
    )
    decision = refused.decision
    assert not decision.promote and decision.failed_gates() == ["max_class_drop"]
    assert f"refused by gate max_class_drop (largest drop: class {best!r} 0.00%" in decision.reason
    assert str(client.get_model_version_by_alias(MODEL_NAME, "champion").version) == first.version
    assert str(client.get_model_version_by_alias(MODEL_NAME, "challenger").version) == refused.version
    tags = client.get_model_version(MODEL_NAME, refused.version).tags
    assert tags["gate.margin"].startswith("passed:") and tags["gate.min_accuracy"].startswith("passed:")
    assert tags["gate.max_class_drop"].startswith(f"failed: largest drop: class {best!r}")
    assert tags["gate.newest_slice"].startswith("reported:") and tags["promotion_decision"] == "kept_champion"
    # The training's MLflow run says the same.
    record_gates_on_run(decision, client.get_model_version(MODEL_NAME, refused.version).run_id, uri)
    run_tags = client.get_run(client.get_model_version(MODEL_NAME, refused.version).run_id).data.tags
    assert (
        run_tags["gate.max_class_drop"] == tags["gate.max_class_drop"]
        and run_tags["promotion_decision"] == "kept_champion"
    )

    # The same challenger without the gate: the margin alone promotes it, so the gate is what refused it.
    _, _, promoted = evaluate_and_register(tmp_path, uri, MODEL_NAME, collapsed, "collapsed-ungated", 0.0)
    assert promoted.decision.promote and "gate.max_class_drop" not in promoted.decision.tags()
    assert str(client.get_model_version_by_alias(MODEL_NAME, "champion").version) == promoted.version
