"""The registered model as users get it: a real `mlflow server`, a registered version with alias `champion`,
then pyfunc, pytorch and `mlflow models serve` loaders on raw uint8 images of several batch sizes.

One MLflow server and one tiny (8-step) network are shared by the whole module.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch
from conftest import free_port
from model_helpers import needs_data, real_images, register_network, tiny_trained_network
from tracking.mlflow_helpers import MlflowServer

pytestmark = [pytest.mark.integration, needs_data]

MODEL_NAME = "fashion-test"
BIN = os.path.dirname(sys.executable)
BATCHES = (1, 7, 500)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """An `mlflow server`, and a version of MODEL_NAME registered from a run, aliased `champion`."""
    import mlflow

    server = MlflowServer(str(tmp_path_factory.mktemp("mlflow"))).start()
    try:
        network = tiny_trained_network()
        version, card = register_network(network, server.uri, MODEL_NAME, recipe="tiny-test", test_accuracy=0.5)
        mlflow.set_tracking_uri(server.uri)
        yield {"server": server, "network": network, "version": version, "card": card}
    finally:
        mlflow.set_tracking_uri(None)
        server.stop()


@pytest.fixture(scope="module")
def champion(registry):
    import mlflow

    return mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}@champion")


def training_code_labels(network: torch.nn.Module, images: torch.Tensor) -> list[int]:
    """Labels as the training code's own evaluation computes them (its input transform, argmax of logits)."""
    from tasks.domain.network import to_inputs

    with torch.no_grad():
        return network(to_inputs(images)).argmax(1).tolist()


@pytest.mark.timeout(900)  # the first test also pays for the module's server, training and registration
def test_pyfunc_takes_raw_uint8_images_of_any_batch_size(champion):
    for n in BATCHES:
        images, _ = real_images(False, 500)
        out = champion.predict(images[:n].numpy())
        assert list(out.columns) == ["label", "class", "probability", "probabilities"]
        assert len(out) == n
        probs = np.stack(out["probabilities"].to_list())
        assert probs.shape == (n, 10)
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)
        assert (probs.argmax(axis=1) == out["label"].to_numpy()).all()
        np.testing.assert_allclose(out["probability"].to_numpy(), probs.max(axis=1))


def test_pyfunc_labels_match_the_training_code_evaluation(registry, champion):
    from tasks.domain.dataset_registry import get_dataset_spec
    from tasks.domain.evaluation import evaluate_model

    images, labels = real_images(False, 500)
    out = champion.predict(images.numpy())
    expected = training_code_labels(registry["network"], images)
    assert out["label"].tolist() == expected
    assert len(set(expected)) >= 3, "the tiny network should tell several classes apart"
    assert out["class"].tolist() == [get_dataset_spec("fashion-mnist").class_names[i] for i in expected]
    # The evaluate step's confusion matrix counts the same predictions.
    report = evaluate_model(registry["network"], images, labels, get_dataset_spec("fashion-mnist").class_names)
    matrix = np.zeros((10, 10), dtype=int)
    np.add.at(matrix, (labels.numpy(), out["label"].to_numpy()), 1)
    assert matrix.tolist() == report.confusion_matrix


def test_every_accepted_input_form_gives_the_same_labels(champion):
    images, _ = real_images(False, 7)
    want = champion.predict(images.numpy())["label"].tolist()
    forms = {
        "float 0-255": images.numpy().astype(np.float32),
        "[N, 784]": images.numpy().reshape(7, 784),
        "[N, 1, 28, 28]": images.numpy()[:, None],
        "torch tensor": images,
        "nested lists": images.numpy().tolist(),
    }
    for name, form in forms.items():
        assert champion.predict(form)["label"].tolist() == want, name


@pytest.mark.parametrize(
    "bad, words",
    [
        (np.zeros((3, 27, 27), dtype=np.uint8), "[3, 27, 27]"),
        (np.zeros((28, 28), dtype=np.uint8), "add a batch dimension"),
        (np.zeros((0, 28, 28), dtype=np.uint8), "no image"),
        (np.full((2, 28, 28), 300.0), "0..255"),
        (np.full((2, 28, 28), 0.5), "multiply by 255"),
        (np.array([["a"] * 784]), "dtype"),
    ],
)
def test_bad_input_is_refused_with_the_expected_shape(champion, bad, words):
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as info:
        champion.predict(bad)
    message = str(info.value)
    assert words in message
    assert "[N, 28, 28], [N, 784] or [N, 1, 28, 28]" in message


def test_registry_descriptions_and_tags_say_what_goes_in_and_out(registry):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=registry["server"].uri)
    model = client.get_registered_model(MODEL_NAME)
    assert "[N, 28, 28]" in model.description and "probabilities" in model.description
    version = client.get_model_version(MODEL_NAME, registry["version"].version)
    digest = registry["card"].dataset.digest
    assert digest in version.description and "tiny-test" in version.description
    assert version.tags["dataset_md5"] == digest
    assert version.tags["recipe"] == "tiny-test"
    info = __import__("mlflow").models.get_model_info(f"models:/{MODEL_NAME}@champion")
    assert info.metadata["dataset"]["digest"] == digest
    assert info.metadata["class_names"][9] == "Ankle boot"
    assert set(info.flavors) >= {"python_function", "pytorch"}
    assert info.signature.outputs.input_names() == ["label", "class", "probability", "probabilities"]
    assert info.saved_input_example_info["type"] == "ndarray"


FRESH_PROCESS = textwrap.dedent("""
    import json, os, sys
    # This process must not see the project (the venv may have it installed in editable mode).
    for name in ("tasks", "flows", "trainlib"):
        sys.modules[name] = None
    import numpy as np, mlflow, torch
    uri, images = sys.argv[1], np.load(sys.argv[2])
    out = {}
    pyfunc = mlflow.pyfunc.load_model(uri)
    out["pyfunc"] = {n: pyfunc.predict(images[:n])["label"].tolist() for n in (1, 7, 500)}
    network = pyfunc.unwrap_python_model().network
    assert isinstance(network, torch.nn.Module) and type(network).__name__ == "ResNet18"
    os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] = "true"
    module = mlflow.pytorch.load_model(uri)
    assert type(module).__name__ == "ResNet18", type(module)
    assert "torchvision" not in sys.modules  # the model file defines its network: no torchvision needed
    import copy
    tuned = copy.deepcopy(module).train()  # a plain nn.Module: can be fine-tuned (on a copy: BN stats move)
    tuned(torch.randn(4, 1, 28, 28)).sum().backward()
    assert tuned.conv1.weight.grad is not None
    x = (torch.from_numpy(images).float() / 255 - 0.28604) / 0.32025
    with torch.no_grad():
        out["pytorch"] = {n: module(x[:n, None]).argmax(1).tolist() for n in (1, 7, 500)}
    out["leaked"] = sorted(m for m in sys.modules if m.split(".")[0] in ("tasks", "flows", "trainlib")
                           and sys.modules[m] is not None)
    print("RESULT " + json.dumps(out))
""")


def test_a_fresh_process_without_the_project_loads_and_predicts(registry, champion, tmp_path):
    images, _ = real_images(False, 500)
    np.save(tmp_path / "images.npy", images.numpy())
    (tmp_path / "fresh.py").write_text(FRESH_PROCESS)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_ALLOW_PICKLE_DESERIALIZATION")}
    env["MLFLOW_TRACKING_URI"] = registry["server"].uri
    done = subprocess.run(
        [sys.executable, "fresh.py", f"models:/{MODEL_NAME}@champion", "images.npy"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Add type hints" not in done.stderr  # MLflow's warning about the model class, which a user would see
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    want = champion.predict(images.numpy())["label"].tolist()
    for loader in ("pyfunc", "pytorch"):
        for n in ("1", "7", "500"):
            assert result[loader][n] == want[: int(n)], (loader, n)
    assert result["leaked"] == []


def test_pytorch_loader_in_process_gives_the_network_for_any_batch(registry, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", "true")
    module = mlflow.pytorch.load_model(f"models:/{MODEL_NAME}@champion")
    images, _ = real_images(False, 500)
    for n in BATCHES:
        want = training_code_labels(registry["network"], images[:n])
        assert training_code_labels(module, images[:n]) == want


# -- mlflow models serve ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(registry, tmp_path_factory):
    """`mlflow models serve -m models:/NAME@champion --env-manager local` on a free port."""
    port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(MLFLOW_TRACKING_URI=registry["server"].uri, PATH=f"{BIN}:{env.get('PATH', '')}")
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                f"{BIN}/mlflow",
                "models",
                "serve",
                "-m",
                f"models:/{MODEL_NAME}@champion",
                "--env-manager",
                "local",
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-w",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(log_path.parent),
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
                raise RuntimeError(f"mlflow models serve did not come up:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)


def post(url: str, payload: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{url}/invocations", data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.timeout(600)  # includes starting `mlflow models serve`
def test_served_model_answers_raw_images_like_pyfunc(served, champion):
    images, _ = real_images(False, 500)
    for n in BATCHES:
        status, body = post(served, {"inputs": images[:n].numpy().tolist()})
        assert status == 200, body
        rows = body["predictions"]
        want = champion.predict(images[:n].numpy())
        assert [row["label"] for row in rows] == want["label"].tolist()
        assert [row["class"] for row in rows] == want["class"].tolist()
        assert len(rows[0]["probabilities"]) == 10
    # [N, 784] rows as a DataFrame of pixel columns work too.
    status, body = post(served, {"dataframe_split": {"data": images[:7].numpy().reshape(7, 784).tolist()}})
    assert status == 200, body
    assert [row["label"] for row in body["predictions"]] == champion.predict(images[:7].numpy())["label"].tolist()


def test_served_model_refuses_a_bad_shape_with_a_clear_error(served):
    status, body = post(served, {"inputs": np.zeros((2, 27, 27), dtype=np.uint8).tolist()})
    assert status == 400
    assert "[2, 27, 27]" in body["message"] and "[N, 28, 28]" in body["message"]
