"""Fair promotion on a real MLflow registry (SQLite store): the champion is scored on the challenger's test
images in the same run, and only a win by at least `min_margin` moves it (ties and smaller wins do not)."""

from __future__ import annotations

import os

import pytest
import torch
from model_helpers import default_architecture, evaluate_and_register, needs_data, real_images, tiny_trained_network

pytestmark = [pytest.mark.integration, needs_data]

MODEL_NAME = "promotion-test"
N_TEST = 300


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    root = tmp_path_factory.mktemp("promotion")
    return {"uri": f"sqlite:///{root}/mlflow.db", "root": root}


def _evaluate_and_register(registry, network, name: str, min_margin: float):
    return evaluate_and_register(
        registry["root"], registry["uri"], MODEL_NAME, network, name, min_margin, n_test=N_TEST
    )


@pytest.mark.timeout(900)  # four registrations of a 45 MB model; generous for a loaded 2-core machine
def test_tie_and_below_margin_keep_the_champion_and_a_real_win_takes_it(registry, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)  # where MLflow's Default experiment of this SQLite store would put files
    client = MlflowClient(tracking_uri=registry["uri"])
    torch.manual_seed(0)
    from tasks.domain.classifier_network import build_network

    weak = build_network(architecture=default_architecture()).eval()
    strong = tiny_trained_network(steps=12)

    # No champion yet: the first version takes it.
    report1, champion1, first = _evaluate_and_register(registry, weak, "weak", min_margin=0.0)
    assert champion1.version is None and first.decision.promote and first.version == "1"

    # The same network again: scored champion == challenger on the same images -> a tie keeps version 1.
    report2, champion2, tie = _evaluate_and_register(registry, weak, "weak-again", min_margin=0.0)
    assert champion2.version == "1" and champion2.accuracy == pytest.approx(report2.accuracy, abs=1e-12)
    # Same test files, as many images, and the loaded champion gave its registered labels for the probe images:
    # its recorded accuracy is taken instead of scoring it on every image again.
    assert champion2.recorded
    assert champion2.accuracy == pytest.approx(report1.accuracy, abs=1e-12)  # same images, same model
    assert not tie.decision.promote and str(client.get_model_version_by_alias(MODEL_NAME, "champion").version) == "1"
    tags = client.get_model_version(MODEL_NAME, tie.version).tags
    assert tags["promotion_decision"] == "kept_champion" and float(tags["promotion_margin"]) == 0.0
    assert tags["test_data_md5"] == "test-md5" and tags["previous_champion_version"] == "1"

    # A better network, but the required margin is larger than its win: champion kept.
    report3, champion3, below = _evaluate_and_register(registry, strong, "strong-below-margin", min_margin=0.99)
    win = report3.accuracy - champion3.accuracy
    assert 0 < win < 0.99, (report3.accuracy, champion3.accuracy)
    assert not below.decision.promote and "champion kept" in below.decision.reason
    assert str(client.get_model_version_by_alias(MODEL_NAME, "champion").version) == "1"
    assert str(client.get_model_version_by_alias(MODEL_NAME, "challenger").version) == below.version

    # The same win with a margin it clears: the champion moves; both accuracies and the margin are tags.
    _, champion4, promoted = _evaluate_and_register(registry, strong, "strong", min_margin=win / 2)
    assert promoted.decision.promote
    assert str(client.get_model_version_by_alias(MODEL_NAME, "champion").version) == promoted.version
    tags = client.get_model_version(MODEL_NAME, promoted.version).tags
    assert float(tags["previous_champion_test_accuracy"]) == pytest.approx(champion4.accuracy, abs=1e-6)
    assert float(tags["promotion_margin"]) == pytest.approx(win, abs=1e-6)
    assert float(tags["promotion_min_margin"]) == pytest.approx(win / 2, abs=1e-6)
    assert os.path.basename(tags["checkpoint"]) == "strong"
    # Every registered model's files are under its run's experiment, none in the working directory.
    experiment = client.get_experiment_by_name("promotion")
    logged = client.search_logged_models(experiment_ids=[experiment.experiment_id])
    assert len(logged) == 4 and all(m.artifact_location.startswith(experiment.artifact_location) for m in logged)
    assert not (tmp_path / "mlruns").exists(), sorted(p.name for p in tmp_path.iterdir())

    # The recorded accuracy is taken only when it is for these images and the champion still predicts as it did:
    # other test files, fewer images, or other labels for the probe images, and it is scored on every image.
    from tasks.domain.champion_comparison import score_champion
    from tasks.domain.promotion import PROBE_TAG

    images, labels = real_images(False, N_TEST)
    strong_accuracy = round(float(tags["test_accuracy"]) * N_TEST) / N_TEST  # k / n, as the tag rounds it
    recorded = score_champion(MODEL_NAME, registry["uri"], images, labels, "test-md5")
    assert recorded.recorded and recorded.accuracy == pytest.approx(strong_accuracy, abs=1e-12)
    other_files = score_champion(MODEL_NAME, registry["uri"], images, labels, "other-md5")
    assert not other_files.recorded and other_files.accuracy == pytest.approx(strong_accuracy, abs=1e-12)
    fewer = score_champion(MODEL_NAME, registry["uri"], images[:200], labels[:200], "test-md5")
    assert not fewer.recorded
    from tasks.domain.evaluation import evaluate_model

    assert fewer.accuracy == pytest.approx(
        evaluate_model(strong, images[:200], labels[:200], [str(i) for i in range(10)]).accuracy, abs=1e-12
    )
    probe = client.get_model_version(MODEL_NAME, promoted.version).tags[PROBE_TAG]
    assert probe != "0" * 32  # neither the other files nor fewer images changed the champion's recorded probe
    client.set_model_version_tag(MODEL_NAME, promoted.version, PROBE_TAG, "0" * 32)
    other_labels = score_champion(MODEL_NAME, registry["uri"], images, labels, "test-md5")
    assert not other_labels.recorded and other_labels.accuracy == pytest.approx(strong_accuracy, abs=1e-12)
    # Scored on every image to the accuracy its tags record for these files: its probe is recorded again (as for
    # a champion registered before probes were), so the next run takes the recorded accuracy.
    assert client.get_model_version(MODEL_NAME, promoted.version).tags[PROBE_TAG] == probe
    assert score_champion(MODEL_NAME, registry["uri"], images, labels, "test-md5").recorded
    # Tags that do not hold what it scores are never made takeable.
    client.set_model_version_tag(MODEL_NAME, promoted.version, "test_accuracy", "0.001000")
    client.delete_model_version_tag(MODEL_NAME, promoted.version, PROBE_TAG)
    wrong_tag = score_champion(MODEL_NAME, registry["uri"], images, labels, "test-md5")
    assert not wrong_tag.recorded and wrong_tag.accuracy == pytest.approx(strong_accuracy, abs=1e-12)
    assert PROBE_TAG not in client.get_model_version(MODEL_NAME, promoted.version).tags


def test_recorded_accuracy_is_exact_and_only_for_the_same_files_images_and_probe():
    from tasks.domain.champion_comparison import recorded_accuracy
    from tasks.domain.promotion import ACCURACY_TAG, PROBE_TAG

    tags = {ACCURACY_TAG: "0.333333", "test_images": "3", "test_data_md5": "m", PROBE_TAG: "p"}
    assert recorded_accuracy(tags, "m", 3, "p") == 1 / 3  # k / n again, not the rounded tag: a tie stays a tie
    assert recorded_accuracy(tags, "m", 4, "p") is None
    assert recorded_accuracy(tags, "other", 3, "p") is None
    assert recorded_accuracy(tags, None, 3, "p") is None
    assert recorded_accuracy(tags, "m", 3, "q") is None
    assert recorded_accuracy({**tags, ACCURACY_TAG: "n/a"}, "m", 3, "p") is None
    assert recorded_accuracy({k: v for k, v in tags.items() if k != PROBE_TAG}, "m", 3, "p") is None
