"""Shared pieces of the model tests: real FashionMNIST test images, generated RGB images, tiny quickly trained
networks (gray and RGB), encoding images as PNG/JPEG bytes, registering a network, `mlflow models serve`."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
import torch
from conftest import FASHION_MNIST_MIRROR, free_port

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


def _fit(network: torch.nn.Module, pixels: torch.Tensor, labels: torch.Tensor, batch_size: int) -> torch.nn.Module:
    """One pass of Adam over uint8 ``pixels`` (normalised as the registered model does) in ``batch_size`` steps."""
    from tasks.domain.classifier_model import normalise
    from tasks.domain.network import MEAN, STD

    optimizer = torch.optim.Adam(network.parameters(), lr=2e-3)
    network.train()
    for start in range(0, len(pixels), batch_size):
        x = normalise(pixels[start : start + batch_size], MEAN, STD)
        loss = torch.nn.functional.cross_entropy(network(x), labels[start : start + batch_size])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return network.eval()


def tiny_trained_network(
    steps: int = 8, batch_size: int = 64, seed: int = 0, architecture: str | None = None
) -> torch.nn.Module:
    """The classifier's network (default: the default recipe's) after a few steps on real images (seconds).

    Trained just enough that its labels differ between images, so label comparisons mean something.
    """
    from tasks.domain.classifier_network import build_network

    torch.manual_seed(seed)
    images, labels = real_images(True, steps * batch_size)
    network = build_network(architecture=architecture or default_architecture())
    return _fit(network, images, labels, batch_size)


def dataset_identity():
    from tasks.domain.dataset_registry import get_dataset_spec
    from tasks.domain.model_card import DatasetIdentity

    return DatasetIdentity("fashion-mnist", get_dataset_spec("fashion-mnist").md5s, FASHION_MNIST_DIR)


def register_network(
    network: torch.nn.Module,
    tracking_uri: str,
    model_name: str,
    recipe: str = "tiny-test",
    champion: bool = True,
    test_accuracy: float | None = None,
    architecture: str | None = None,
    image_spec=None,
):
    """Register ``network`` from a fresh MLflow run as a new version of ``model_name`` (maybe as champion);
    ``image_spec``: the images' shape and classes (default: FashionMNIST's gray 28x28)."""
    from mlflow import MlflowClient

    from tasks.domain.model_card import ModelCard
    from tasks.domain.model_package import log_and_register

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name("model-tests")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("model-tests")
    run = client.create_run(experiment_id, run_name=recipe)
    card = ModelCard(
        dataset=dataset_identity(),
        recipe={"name": recipe},
        test_accuracy=test_accuracy,
        architecture=architecture or default_architecture(),
        image_spec=image_spec,
    )
    version = log_and_register(network, card, model_name, run.info.run_id, tracking_uri)
    client.set_terminated(run.info.run_id)
    if champion:
        client.set_registered_model_alias(model_name, "champion", version.version)
    return version, card


RGB_CLASSES = ("red", "green", "blue")


def generated_rgb_images(n: int, height: int = 32, width: int = 32, seed: int = 0):
    """``n`` uint8 RGB images ``[n, height, width, 3]`` of three classes (the bright channel is the class) and
    their labels ``[n]``: generated, so that a few training steps tell them apart."""
    import numpy as np

    rng = np.random.default_rng(seed)
    labels = np.arange(n) % len(RGB_CLASSES)
    images = rng.integers(0, 90, (n, height, width, 3), dtype=np.uint8)
    for i, label in enumerate(labels):
        images[i, :, :, label] = rng.integers(150, 256, (height, width), dtype=np.uint8)
    return images, labels


def tiny_rgb_network(spec, steps: int = 6, batch_size: int = 32, seed: int = 0) -> torch.nn.Module:
    """The classifier's network for ``spec`` (RGB) after a few steps on :func:`generated_rgb_images`, fed through
    the preprocessing the registered model uses (``fit_to_spec``) from images of another size."""
    from tasks.domain.classifier_network import build_network
    from tasks.domain.image_preprocessing import fit_to_spec

    torch.manual_seed(seed)
    images, labels = generated_rgb_images(steps * batch_size, spec.height + 8, spec.width + 8, seed)
    pixels = fit_to_spec(torch.from_numpy(images).permute(0, 3, 1, 2), spec.channels, spec.height, spec.width)
    targets = torch.from_numpy(labels)
    network = build_network(spec.num_classes, default_architecture(), in_channels=spec.channels)
    return _fit(network, pixels, targets, batch_size)


def encoded(images, fmt: str = "PNG", size: tuple[int, int] | None = None) -> list[bytes]:
    """Each uint8 image (``[H, W]`` or ``[H, W, 3]``) encoded as ``fmt`` bytes, resized to ``size`` (w, h) first."""
    import io

    import numpy as np
    from PIL import Image

    out = []
    for image in images:
        picture = Image.fromarray(np.asarray(image, dtype=np.uint8))
        if size:
            picture = picture.resize(size)
        buffer = io.BytesIO()
        picture.save(buffer, format=fmt)
        out.append(buffer.getvalue())
    return out


BIN = os.path.dirname(sys.executable)  # the venv's bin/: `mlflow models serve` execs its uvicorn from PATH


@contextlib.contextmanager
def mlflow_models_serve(model_uri: str, tracking_uri: str, log_dir) -> Iterator[str]:
    """`mlflow models serve -m MODEL_URI --env-manager local` on a free port; yields its base URL."""
    port = free_port()
    log_path = os.path.join(str(log_dir), "serve.log")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the model loads from its own code/ folder
    env.update(MLFLOW_TRACKING_URI=tracking_uri, PATH=f"{BIN}:{env.get('PATH', '')}")
    command = [f"{BIN}/mlflow", "models", "serve", "-m", model_uri, "--env-manager", "local"]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*command, "-h", "127.0.0.1", "-p", str(port), "-w", "1"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(log_dir),
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                with open(log_path) as log:
                    raise RuntimeError(f"mlflow models serve did not come up:\n{log.read()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)


def post_invocations(url: str, payload: dict) -> tuple[int, dict]:
    """POST ``payload`` as JSON to a served model's ``/invocations``: the status and the decoded answer."""
    request = urllib.request.Request(
        f"{url}/invocations", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


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
    from tasks.domain.champion_comparison import Comparison, probe_digest, score_champion
    from tasks.domain.dataset_registry import get_dataset_spec
    from tasks.domain.evaluation import evaluate_model
    from tasks.domain.model_card import ModelCard
    from tasks.domain.model_registry import register_and_promote

    images, labels = real_images(False, n_test)
    training = challenger_outcome(root, tracking_uri, network, name)
    class_names = get_dataset_spec("fashion-mnist").class_names
    report = evaluate_model(network, images, labels, class_names)
    champion = score_champion(model_name, tracking_uri, images, labels, "test-md5", num_classes=len(class_names))
    comparison = Comparison(
        report=report, champion=champion, test_data_md5="test-md5", probe=probe_digest(network, images)
    )
    card = ModelCard(dataset=dataset_identity(), recipe={"name": name})
    registration = register_and_promote(
        training, comparison, card, model_name, tracking_uri, min_margin=min_margin, gates=gates
    )
    return report, champion, registration
