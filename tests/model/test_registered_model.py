"""The registered model as users get it: a real `mlflow server`, a registered version with alias `champion`,
then pyfunc, pytorch and `mlflow models serve` loaders on raw uint8 images of several batch sizes, and on the
images clients have: PNG and JPEG bytes, base64 strings in JSON, arrays of other sizes.

One MLflow server, one tiny (8-step) gray network and one tiny RGB 32x32 network of three classes (trained a few
steps on generated images) are shared by the whole module; `mlflow models serve` serves the gray one.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest
import torch
from model_helpers import (
    RGB_CLASSES,
    encoded,
    generated_rgb_images,
    mlflow_models_serve,
    needs_data,
    post_invocations,
    real_images,
    register_network,
    tiny_rgb_network,
    tiny_trained_network,
)
from tracking.mlflow_helpers import MlflowServer

pytestmark = [pytest.mark.integration, needs_data]

MODEL_NAME = "fashion-test"
RGB_MODEL_NAME = "rgb-test"
BATCHES = (1, 7, 500)


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """An `mlflow server`, and a version of MODEL_NAME (gray 28x28) and one of RGB_MODEL_NAME (RGB 32x32, three
    classes) registered from runs, each aliased `champion`."""
    import mlflow

    from tasks.domain.image_spec import ImageSpec

    server = MlflowServer(str(tmp_path_factory.mktemp("mlflow"))).start()
    try:
        network = tiny_trained_network()
        version, card = register_network(network, server.uri, MODEL_NAME, recipe="tiny-test", test_accuracy=0.5)
        spec = ImageSpec(channels=3, height=32, width=32, class_names=RGB_CLASSES)
        rgb_network = tiny_rgb_network(spec)
        rgb_version, _ = register_network(rgb_network, server.uri, RGB_MODEL_NAME, recipe="rgb", image_spec=spec)
        mlflow.set_tracking_uri(server.uri)
        yield {
            "server": server,
            "network": network,
            "version": version,
            "card": card,
            "rgb": {"network": rgb_network, "spec": spec, "version": rgb_version},
        }
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
        (np.zeros((28, 28), dtype=np.uint8), "add a batch dimension"),
        (np.zeros((0, 28, 28), dtype=np.uint8), "no image"),
        (np.full((2, 28, 28), 300.0), "0..255"),
        (np.full((2, 28, 28), 0.5), "multiply by 255"),
        (np.array([["a"] * 784]), "dtype"),
        ([b"\x89PNG\r\n\x1a\n cut"], "Row 0: its 12 bytes are not a readable image"),
    ],
)
def test_bad_input_is_refused_with_what_is_accepted(champion, bad, words):
    from mlflow.exceptions import MlflowException

    with pytest.raises(MlflowException) as info:
        champion.predict(bad)
    message = str(info.value)
    assert words in message
    assert "PNG or JPEG images" in message and "[N, H, W], [N, H, W, C] or [N, C, H, W]" in message
    assert "converted to gray and resized to 28x28" in message


def test_a_gray_model_takes_other_sizes_and_encoded_images_like_its_arrays(champion):
    from tasks.domain.image_preprocessing import resize

    images, _ = real_images(False, 7)
    want = champion.predict(images.numpy())["label"].tolist()
    assert champion.predict(pd.DataFrame({"image": encoded(images.numpy())}))["label"].tolist() == want
    rgb = np.repeat(images.numpy()[..., None], 3, axis=3)  # gray pixels as RGB: converted back exactly
    assert champion.predict(pd.DataFrame({"image": encoded(rgb)}))["label"].tolist() == want
    larger = resize(images[:, None], 56, 56)[:, 0].numpy()  # other sizes are resized to 28x28
    assert (
        champion.predict(larger)["label"].tolist()
        == champion.predict(resize(torch.from_numpy(larger)[:, None], 28, 28))["label"].tolist()
    )


def test_registry_descriptions_and_tags_say_what_goes_in_and_out(registry):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=registry["server"].uri)
    model = client.get_registered_model(MODEL_NAME)
    assert "gray 28x28" in model.description and "probabilities" in model.description
    assert "PNG or JPEG images" in model.description and "base64" in model.description
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
    assert info.metadata["image"] == {
        "channels": 1,
        "height": 28,
        "width": 28,
        "class_names": info.metadata["class_names"],
    }
    rgb = __import__("mlflow").models.get_model_info(f"models:/{RGB_MODEL_NAME}@champion")
    assert rgb.metadata["image"] == registry["rgb"]["spec"].record()
    assert "converted to RGB and resized to 32x32" in rgb.metadata["input"]
    version = client.get_model_version(RGB_MODEL_NAME, registry["rgb"]["version"].version)
    assert "RGB 32x32" in version.description and version.tags["image"] == "RGB 32x32"


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
    # The model file defines its network: no torchvision needed (mlflow.pytorch, below, may import it itself:
    # with torchmetrics installed it does).
    assert "torchvision" not in sys.modules
    network = pyfunc.unwrap_python_model().network
    assert isinstance(network, torch.nn.Module) and type(network).__name__ == "ResNet18"
    os.environ["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] = "true"
    module = mlflow.pytorch.load_model(uri)
    assert type(module).__name__ == "ResNet18", type(module)
    import copy
    tuned = copy.deepcopy(module).train()  # a plain nn.Module: can be fine-tuned (on a copy: BN stats move)
    tuned(torch.randn(4, 1, 28, 28)).sum().backward()
    assert tuned.conv1.weight.grad is not None
    x = (torch.from_numpy(images).float() / 255 - 0.28604) / 0.32025
    with torch.no_grad():
        out["pytorch"] = {n: module(x[:n, None]).argmax(1).tolist() for n in (1, 7, 500)}
    # The RGB model, on the images clients have: PNG bytes, JPEG bytes of another size, arrays of another size.
    import pickle
    import pandas as pd
    with open(sys.argv[4], "rb") as f:
        inputs = pickle.load(f)
    rgb = mlflow.pyfunc.load_model(sys.argv[3])
    out["rgb"] = {
        "png": rgb.predict(pd.DataFrame({"image": inputs["png"]}))["class"].tolist(),
        "jpeg": rgb.predict(pd.DataFrame({"image": inputs["jpeg"]}))["class"].tolist(),
        "arrays": rgb.predict(inputs["arrays"])["class"].tolist(),
    }
    out["leaked"] = sorted(m for m in sys.modules if m.split(".")[0] in ("tasks", "flows", "trainlib")
                           and sys.modules[m] is not None)
    print("RESULT " + json.dumps(out))
""")


def rgb_client_inputs() -> tuple[dict, list[str]]:
    """Generated RGB images as clients send them (PNG 40x48, JPEG 64x56, uint8 arrays 24x20) and their classes."""
    images, labels = generated_rgb_images(9, 40, 48, seed=3)
    small, small_labels = generated_rgb_images(9, 24, 20, seed=4)
    inputs = {"png": encoded(images), "jpeg": encoded(images, "JPEG", size=(56, 64)), "arrays": small}
    assert (labels == small_labels).all()
    return inputs, [RGB_CLASSES[i] for i in labels]


def test_a_fresh_process_without_the_project_loads_and_predicts(registry, champion, tmp_path):
    import pickle

    import mlflow

    from tasks.domain.classifier_model import as_image_batch, predict_probabilities
    from tasks.domain.network import MEAN, STD

    images, _ = real_images(False, 500)
    np.save(tmp_path / "images.npy", images.numpy())
    rgb_inputs, rgb_classes = rgb_client_inputs()
    (tmp_path / "rgb.pkl").write_bytes(pickle.dumps(rgb_inputs))
    (tmp_path / "fresh.py").write_text(FRESH_PROCESS)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_ALLOW_PICKLE_DESERIALIZATION")}
    env["MLFLOW_TRACKING_URI"] = registry["server"].uri
    done = subprocess.run(
        [sys.executable, "fresh.py", f"models:/{MODEL_NAME}@champion", "images.npy"]
        + [f"models:/{RGB_MODEL_NAME}@champion", "rgb.pkl"],
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
    # The RGB model in the fresh process: the classes of the training network fed the one preprocessing, and the
    # in-process pyfunc's; the generated colours are learnt, so the classes are the true ones.
    rgb = registry["rgb"]
    in_process = mlflow.pyfunc.load_model(f"models:/{RGB_MODEL_NAME}@champion")
    for form in ("png", "jpeg", "arrays"):
        data = rgb_inputs[form] if form == "arrays" else pd.DataFrame({"image": rgb_inputs[form]})
        pixels = as_image_batch(data, rgb["spec"])
        labels = predict_probabilities(rgb["network"], pixels, MEAN, STD).argmax(1).tolist()
        assert result["rgb"][form] == [RGB_CLASSES[i] for i in labels], form
        assert result["rgb"][form] == in_process.predict(data)["class"].tolist(), form
        assert result["rgb"][form] == rgb_classes, form


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
    with mlflow_models_serve(
        f"models:/{MODEL_NAME}@champion", registry["server"].uri, tmp_path_factory.mktemp("serve")
    ) as url:
        yield url


post = post_invocations


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


def test_served_model_takes_base64_pngs_in_json_and_arrays_of_other_sizes(served, champion):
    images, _ = real_images(False, 7)
    want = champion.predict(images.numpy())
    texts = [base64.b64encode(data).decode() for data in encoded(images.numpy())]
    payloads = {
        "dataframe_split": {"dataframe_split": {"columns": ["image"], "data": [[text] for text in texts]}},
        "dataframe_records": {"dataframe_records": [{"image": text} for text in texts]},
        "inputs by name": {"inputs": {"image": texts}},
        "inputs": {"inputs": texts},
    }
    for name, payload in payloads.items():
        status, body = post(served, payload)
        assert status == 200, (name, body)
        assert [row["label"] for row in body["predictions"]] == want["label"].tolist(), name
        assert [row["class"] for row in body["predictions"]] == want["class"].tolist(), name
    status, body = post(served, {"inputs": np.full((2, 27, 33), 200, dtype=np.uint8).tolist()})  # resized
    assert status == 200 and len(body["predictions"]) == 2, body


def test_served_model_refuses_bad_input_with_the_row_and_what_is_accepted(served):
    [good] = [base64.b64encode(data).decode() for data in encoded(real_images(False, 1)[0].numpy())]
    cases = [
        ({"dataframe_split": {"columns": ["image"], "data": [[good], ["not base64!"]]}}, "Row 1: the string"),
        ({"dataframe_records": [{"image": base64.b64encode(b"plain text").decode()}]}, "Row 0: its 10 bytes"),
        ({"dataframe_split": {"columns": ["picture"], "data": [[good]]}}, "column named 'image'"),
        ({"inputs": np.zeros((2, 3, 4, 5, 6), dtype=np.uint8).tolist()}, "[2, 3, 4, 5, 6]"),
    ]
    for payload, words in cases:
        status, body = post(served, payload)
        assert status == 400, (payload, body)
        assert words in body["message"] and "PNG or JPEG images" in body["message"], body["message"]
