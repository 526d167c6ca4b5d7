"""Shared pieces of the model tests: real FashionMNIST test images and a tiny, quickly trained network."""

from __future__ import annotations

import functools
import os

import pytest
import torch
from conftest import FASHION_MNIST_MIRROR

# The repo's sibling shared/ folder; a git worktree elsewhere names it with TRAINLIB_TEST_FASHION_MNIST.
FASHION_MNIST_DIR = os.environ.get("TRAINLIB_TEST_FASHION_MNIST") or FASHION_MNIST_MIRROR


def default_architecture() -> str:
    """The network the pipeline trains and registers by default (its default recipe's)."""
    from tasks.domain.recipe import DEFAULT_RECIPE, get_recipe

    return get_recipe(DEFAULT_RECIPE).architecture


needs_data = pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST_DIR), reason=f"the FashionMNIST mirror {FASHION_MNIST_DIR} is missing"
)


@functools.lru_cache(maxsize=2)
def real_images(train: bool, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``limit`` real FashionMNIST images (uint8 [N, 28, 28]) and labels of a split."""
    from tasks.domain.idx_files import load_fashion_mnist_split

    return load_fashion_mnist_split(FASHION_MNIST_DIR, train=train, limit=limit)


def tiny_trained_network(
    steps: int = 8, batch_size: int = 64, seed: int = 0, architecture: str | None = None
) -> torch.nn.Module:
    """The classifier's network (default: the default recipe's) after a few steps on real images (seconds).

    Trained just enough that its labels differ between images, so label comparisons mean something.
    """
    from tasks.domain.classifier_model import normalise
    from tasks.domain.classifier_network import build_network
    from tasks.domain.network import MEAN, STD

    torch.manual_seed(seed)
    images, labels = real_images(True, steps * batch_size)
    network = build_network(architecture=architecture or default_architecture())
    optimizer = torch.optim.Adam(network.parameters(), lr=2e-3)
    network.train()
    for start in range(0, steps * batch_size, batch_size):
        x = normalise(images[start : start + batch_size], MEAN, STD)
        loss = torch.nn.functional.cross_entropy(network(x), labels[start : start + batch_size])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return network.eval()


def dataset_identity():
    from tasks.domain.dataset_registry import get_dataset_spec
    from tasks.domain.model_package import DatasetIdentity

    return DatasetIdentity("fashion-mnist", get_dataset_spec("fashion-mnist").md5s, FASHION_MNIST_DIR)


def register_network(
    network: torch.nn.Module,
    tracking_uri: str,
    model_name: str,
    recipe: str = "tiny-test",
    champion: bool = True,
    test_accuracy: float | None = None,
    architecture: str | None = None,
):
    """Register ``network`` from a fresh MLflow run as a new version of ``model_name`` (maybe as champion)."""
    from mlflow import MlflowClient

    from tasks.domain.model_package import ModelCard, log_and_register

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name("model-tests")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("model-tests")
    run = client.create_run(experiment_id, run_name=recipe)
    card = ModelCard(
        dataset=dataset_identity(),
        recipe={"name": recipe},
        test_accuracy=test_accuracy,
        architecture=architecture or default_architecture(),
    )
    version = log_and_register(network, card, model_name, run.info.run_id, tracking_uri)
    client.set_terminated(run.info.run_id)
    if champion:
        client.set_registered_model_alias(model_name, "champion", version.version)
    return version, card


def challenger_outcome(root, tracking_uri: str, network: torch.nn.Module, name: str):
    """A checkpoint folder under ``root`` and an MLflow run for ``network``, as the training step leaves them."""
    from mlflow import MlflowClient

    from tasks.domain.network import MODEL_FILE
    from tasks.domain.training_run import TrainingOutcome

    folder = root / name
    folder.mkdir()
    torch.save(network.state_dict(), folder / MODEL_FILE)
    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name("promotion") or client.get_experiment(
        client.create_experiment("promotion", artifact_location=str(root / "artifacts"))
    )
    run = client.create_run(experiment.experiment_id, run_name=name)
    return TrainingOutcome(
        run_path=str(root),
        checkpoint_uri=str(folder),
        metrics={},
        history=[],
        mlflow_run_id=run.info.run_id,
        seconds=0.0,
        architecture=default_architecture(),
    )


def evaluate_and_register(
    root,
    tracking_uri: str,
    model_name: str,
    network: torch.nn.Module,
    name: str,
    min_margin: float,
    n_test: int = 300,
    gates=None,
):
    """What the evaluate and register steps do: both models on the same ``n_test`` images, then the rule and
    ``gates`` (a ``GateSettings``). Returns the challenger's report, the champion's score and the registration."""
    from tasks.domain.dataset_registry import get_dataset_spec
    from tasks.domain.evaluation import evaluate_model
    from tasks.domain.model_package import ModelCard
    from tasks.domain.model_registry import Comparison, probe_digest, register_and_promote, score_champion

    images, labels = real_images(False, n_test)
    training = challenger_outcome(root, tracking_uri, network, name)
    class_names = get_dataset_spec("fashion-mnist").class_names
    report = evaluate_model(network, images, labels, class_names)
    champion = score_champion(model_name, tracking_uri, images, labels, "test-md5", len(class_names))
    comparison = Comparison(
        report=report, champion=champion, test_data_md5="test-md5", probe=probe_digest(network, images)
    )
    card = ModelCard(dataset=dataset_identity(), recipe={"name": name})
    registration = register_and_promote(
        training, comparison, card, model_name, tracking_uri, min_margin=min_margin, gates=gates
    )
    return report, champion, registration
