"""Promotion fails closed, on a real MLflow registry (SQLite store) with tiny registered networks: a champion whose
files are damaged is kept (the challenger is registered, not promoted, and the run's error names the champion), a
champion of another data set is not compared, a dangling alias names its missing version, and a locked registry
is retried, never read as "no champion"."""

from __future__ import annotations

import glob
import os
import sqlite3

import pytest
import torch
from model.model_helpers import needs_data, real_images, register_network

pytestmark = [pytest.mark.integration, needs_data, pytest.mark.timeout(600)]

ARCHITECTURE = "resnet18-1ch-small"
N_TEST = 200


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    root = tmp_path_factory.mktemp("champion")
    return {"uri": f"sqlite:///{root}/mlflow.db", "root": root}


@pytest.fixture(scope="module")
def network():
    from tasks.domain.classifier_network import build_network

    torch.manual_seed(0)
    return build_network(architecture=ARCHITECTURE).eval()


def _challenger(registry, network, name: str):
    """A checkpoint folder and an MLflow run for ``network``, as the training step leaves them."""
    from mlflow import MlflowClient

    from tasks.domain.network import MODEL_FILE
    from tasks.domain.training_run import TrainingOutcome

    folder = registry["root"] / name
    folder.mkdir()
    torch.save(network.state_dict(), folder / MODEL_FILE)
    client = MlflowClient(tracking_uri=registry["uri"])
    experiment = client.get_experiment_by_name("model-tests")
    run = client.create_run(experiment.experiment_id, run_name=name)
    return TrainingOutcome(
        run_path=str(registry["root"]),
        checkpoint_uri=str(folder),
        metrics={},
        history=[],
        mlflow_run_id=run.info.run_id,
        seconds=0.0,
        architecture=ARCHITECTURE,
    )


def test_a_champion_that_cannot_be_loaded_is_kept_and_the_run_fails_naming_it(registry, network, monkeypatch):
    from mlflow import MlflowClient

    from tasks.domain.champion import unscored_champion_error
    from tasks.domain.champion_comparison import Comparison, score_champion
    from tasks.domain.dataset_registry import get_dataset_spec
    from tasks.domain.evaluation import evaluate_model
    from tasks.domain.model_registry import register_and_promote

    monkeypatch.chdir(registry["root"])
    model = "damaged-champion"
    champion, card = register_network(network, registry["uri"], model, architecture=ARCHITECTURE)
    client = MlflowClient(tracking_uri=registry["uri"])
    files = client.get_model_version_download_uri(model, champion.version).removeprefix("file://")
    (weights,) = glob.glob(os.path.join(files, "**", "weights.pt"), recursive=True)
    with open(weights, "r+b") as f:  # the artifact store lost the end of the file
        f.truncate(os.path.getsize(weights) // 2)

    images, labels = real_images(False, N_TEST)
    scored = score_champion(model, registry["uri"], images, labels, "md5", dataset="fashion-mnist")
    assert scored.version == champion.version and scored.accuracy is None and scored.error, scored

    from tasks.domain.classifier_network import build_network

    torch.manual_seed(1)
    untrained = build_network(architecture=ARCHITECTURE).eval()  # what --lr 0 registers
    report = evaluate_model(untrained, images, labels, get_dataset_spec("fashion-mnist").class_names)
    registration = register_and_promote(
        _challenger(registry, untrained, "untrained"), Comparison(report, scored, "md5"), card, model, registry["uri"]
    )
    assert not registration.decision.promote
    assert "could not be scored" in registration.decision.reason and "not promoted" in registration.decision.reason
    assert str(client.get_model_version_by_alias(model, "champion").version) == champion.version
    assert str(client.get_model_version_by_alias(model, "challenger").version) == registration.version
    error = unscored_champion_error(model, scored, registration.version)
    assert error is not None
    assert f"Champion version {champion.version}" in str(error) and scored.error in str(error)
    assert f"new version {registration.version} is registered as 'challenger' but not promoted" in str(error)


def test_a_champion_of_another_data_set_is_not_compared(registry, network, monkeypatch):
    from mlflow import MlflowClient

    from tasks.domain.champion import ChampionMismatchError
    from tasks.domain.champion_comparison import score_champion
    from tasks.domain.dataset_registry import get_dataset_spec
    from tasks.domain.model_card import DatasetIdentity, ModelCard
    from tasks.domain.model_package import log_and_register

    monkeypatch.chdir(registry["root"])
    model = "mnist-champion"
    client = MlflowClient(tracking_uri=registry["uri"])
    experiment = client.get_experiment_by_name("model-tests") or client.get_experiment(
        client.create_experiment("model-tests")
    )
    run = client.create_run(experiment.experiment_id, run_name="mnist")
    card = ModelCard(
        dataset=DatasetIdentity("mnist", get_dataset_spec("mnist").md5s, "/data/mnist"), architecture=ARCHITECTURE
    )
    version = log_and_register(network, card, model, run.info.run_id, registry["uri"]).version
    client.set_registered_model_alias(model, "champion", version)
    images, labels = real_images(False, N_TEST)
    with pytest.raises(ChampionMismatchError, match=rf"version {version}\).*trained on 'mnist', this run on 'fashion"):
        score_champion(model, registry["uri"], images, labels, "md5", dataset="fashion-mnist")


def test_a_dangling_alias_names_its_missing_version_and_no_model_is_no_champion(registry, network, monkeypatch):
    from mlflow import MlflowClient

    from tasks.domain.champion import DanglingAliasError, alias_version

    monkeypatch.chdir(registry["root"])
    model = "dangling-champion"
    champion, _ = register_network(network, registry["uri"], model, architecture=ARCHITECTURE)
    client = MlflowClient(tracking_uri=registry["uri"])
    assert alias_version(client, "no-such-model") is None
    assert alias_version(client, model, "no-such-alias") is None
    assert str(alias_version(client, model).version) == champion.version
    with sqlite3.connect(registry["uri"].removeprefix("sqlite:///")) as db:  # the version's row is gone
        db.execute("DELETE FROM model_versions WHERE name = ?", (model,))
    with pytest.raises(DanglingAliasError, match=rf"points to version {champion.version}, which does not exist"):
        alias_version(client, model)
    from tasks.domain.scoring_model import resolve_alias

    with pytest.raises(DanglingAliasError, match=rf"points to version {champion.version}"):  # the scoring flow's
        resolve_alias(model, "champion", registry["uri"])


def test_a_locked_registry_is_retried_and_never_read_as_no_champion(registry, monkeypatch):
    """Another process holds the registry's SQLite database (MLflow answers "database is locked" after its 20 s
    busy wait; a reader without one answers at once): the read is tried again, and a lock that outlasts the tries
    is said to be one, never read as "no champion"."""
    from mlflow import MlflowClient

    from tasks.domain import champion

    monkeypatch.setattr(champion, "REGISTRY_RETRY_DELAY_S", 0.0)
    path = registry["uri"].removeprefix("sqlite:///")
    locker = sqlite3.connect(path)
    locker.execute("BEGIN EXCLUSIVE")
    calls = []

    def read_without_busy_wait():
        calls.append(1)
        try:
            with sqlite3.connect(path, timeout=0) as reader:
                reader.execute("SELECT count(*) FROM registered_models").fetchone()
            return MlflowClient(tracking_uri=registry["uri"]).search_registered_models()
        finally:
            if len(calls) == 1:
                locker.rollback()  # the other process is done after the first try

    try:
        assert isinstance(champion.registry_call("reading the champion", read_without_busy_wait), list)
        assert len(calls) == 2
        locker.execute("BEGIN EXCLUSIVE")
        calls.clear()
        calls.append(1)  # no release this time
        with pytest.raises(champion.RegistryUnavailableError, match="stayed locked while reading the champion"):
            champion.registry_call("reading the champion", read_without_busy_wait, attempts=2)
    finally:
        locker.rollback()
        locker.close()


def test_check_same_data_names_what_differs():
    from tasks.domain.champion import ChampionMismatchError, check_same_data

    check_same_data("m", "1", "fashion-mnist", None)  # a champion that records nothing is comparable
    check_same_data("m", "1", "fashion-mnist", "fashion-mnist", ("a", "b"), ["a", "b"], "x", "x")
    with pytest.raises(ChampionMismatchError, match=r"its classes are \['a', 'c'\], this run's \['a', 'b'\]"):
        check_same_data("m", "1", "fashion-mnist", "fashion-mnist", ("a", "b"), ["a", "c"])
    with pytest.raises(ChampionMismatchError, match="it takes '32x32', this run's model '28x28'"):
        check_same_data("m", "1", "fashion-mnist", None, None, None, "28x28", "32x32")


def test_each_data_set_registers_under_its_own_model_name_by_default():
    from flows.params import PipelineParams

    assert PipelineParams().model_name == "fashion-mnist-resnet18"
    assert PipelineParams(dataset="mnist").model_name == "mnist-resnet18"
    assert PipelineParams(dataset="mnist", model_name="mine").model_name == "mine"


def test_a_users_data_registers_and_logs_under_its_own_name_by_default():
    from flows.params import PipelineParams

    pets = PipelineParams(data="s3://bucket/pets/")
    assert (pets.model_name, pets.experiment_name) == ("pets-resnet18", "pets")
    manifest = PipelineParams(data="/data/my labels.csv")
    assert (manifest.model_name, manifest.experiment_name) == ("my-labels-resnet18", "my-labels")
    assert PipelineParams().experiment_name == "fashion-mnist"
    assert PipelineParams(data="/data/pets", experiment_name="team").experiment_name == "team"
