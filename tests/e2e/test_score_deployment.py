"""The batch-scoring deployment on real services: a Prefect server, an `mlflow server`, a process work pool
with `prefect worker`, local Ray, and a few hundred real FashionMNIST test images.

The deployment test runs `prefect deploy --all` from prefect.yaml and one `prefect deployment run` of
`score-images`, executed by `prefect worker start --run-once`; the other tests run the flow in this
process against the same servers (an image folder with class folders and CSV output; a manifest on S3 (moto);
errors). The .npy reader is covered by test_model_units.py, the sources' details by test_image_inputs.py.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import re
import struct
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pandas as pd
import pytest
from conftest import REPO_ROOT
from model.model_helpers import encoded, needs_data, real_images, register_network, tiny_trained_network
from prefect_helpers import PrefectServer, using_prefect_server
from tracking.mlflow_helpers import MlflowServer

pytestmark = [pytest.mark.integration, pytest.mark.e2e, needs_data]

BIN = os.path.dirname(sys.executable)
POOL = "trainlib-process"
MODEL_NAME = "fashion-score-test"
N_IMAGES = 300


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """A Prefect server (SQLite, own PREFECT_HOME), an MLflow server, a champion of MODEL_NAME."""
    import mlflow

    root = tmp_path_factory.mktemp("score_services")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "RAY_ADDRESS"))}
    prefect_server = PrefectServer(root, env).start()  # starts while the MLflow server and the model are set up
    mlflow_server = MlflowServer(str(root / "mlflow"))
    try:
        mlflow_server.start()
        network = tiny_trained_network()
        version, _ = register_network(network, mlflow_server.uri, MODEL_NAME)
        prefect_server.wait()
        client_env = dict(
            prefect_server.env, PREFECT_API_URL=prefect_server.api_url, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE="false"
        )
        mlflow.set_tracking_uri(mlflow_server.uri)
        yield {
            "api_url": prefect_server.api_url,
            "mlflow_uri": mlflow_server.uri,
            "env": client_env,
            "root": root,
            "version": version.version,
        }
    finally:
        mlflow.set_tracking_uri(None)
        prefect_server.stop()
        mlflow_server.stop()


def _api(services, path: str, body: dict | None = None):
    request = urllib.request.Request(
        services["api_url"] + path,
        data=json.dumps(body or {}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _cli(services, *args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [f"{BIN}/prefect", *args], cwd=REPO_ROOT, env=services["env"], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """The first N_IMAGES real test images as an idx .gz file, a .npy array and an image folder: class folders
    named by the true label, gray 28x28 PNGs and every tenth image an RGB 56x56 JPEG."""

    folder = tmp_path_factory.mktemp("inputs")
    images, labels = real_images(False, N_IMAGES)
    pixels = images.numpy()
    idx = folder / "t10k-images-idx3-ubyte.gz"
    idx.write_bytes(gzip.compress(struct.pack(">IIII", 0x803, N_IMAGES, 28, 28) + pixels.tobytes(), mtime=0))
    np.save(folder / "images.npy", pixels)
    files = {}  # relative path -> bytes, in the folder's (sorted) order
    for i, (image, label) in enumerate(zip(pixels, labels.tolist(), strict=True)):
        if i % 10 == 0:
            rgb = np.repeat(image[..., None], 3, axis=2)
            files[f"class_{label}/{i:03d}.jpg"] = encoded([rgb], "JPEG", size=(56, 56))[0]
        else:
            files[f"class_{label}/{i:03d}.png"] = encoded([image])[0]
    for relative, data in files.items():
        (folder / "photos" / os.path.dirname(relative)).mkdir(parents=True, exist_ok=True)
        (folder / "photos" / relative).write_bytes(data)
    return {
        "pixels": pixels,
        "idx": str(idx),
        "npy": str(folder / "images.npy"),
        "photos": str(folder / "photos"),
        "files": dict(sorted(files.items())),
    }


@functools.cache
def _champion():
    import mlflow

    return mlflow.pyfunc.load_model(f"models:/{MODEL_NAME}@champion")


def _pyfunc_labels(pixels) -> list[int]:
    """The champion's labels of pixel arrays, or of encoded files (a list of bytes)."""
    model = _champion()
    return model.predict(pd.DataFrame({"image": pixels}) if isinstance(pixels, list) else pixels)["label"].tolist()


def _run_in_process(services, ray_session, **params):
    from flows.score import score_images

    with using_prefect_server(services["api_url"]):
        return score_images(
            {"mlflow_tracking_uri": services["mlflow_uri"], "model_name": MODEL_NAME, **params}, return_state=True
        )


@pytest.mark.timeout(900)  # includes the module's server start-up and registration (setup)
def test_deployment_scores_real_images_like_pyfunc(services, inputs, tmp_path):
    from tasks.domain.predictions_file import read_predictions

    output = str(tmp_path / "out" / "predictions.parquet")
    _cli(services, "work-pool", "create", POOL, "--type", "process")
    out = _cli(services, "--no-prompt", "deploy", "--all")
    assert "score-images" in out
    params = {
        "input_url": inputs["idx"],
        "output_url": output,
        "model_name": MODEL_NAME,
        "mlflow_tracking_uri": services["mlflow_uri"],
        "chunk_size": 50,
        "num_workers": 2,
    }
    out = _cli(services, "deployment", "run", "score-images/score-images", "--params", json.dumps({"params": params}))
    flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)
    worker_output = _cli(services, "worker", "start", "--pool", POOL, "--run-once", timeout=400)
    runs = {run["id"]: run for run in _api(services, "/flow_runs/filter", {"limit": 200})}
    assert runs[flow_run_id]["state_type"] == "COMPLETED", worker_output[-6000:]

    predictions = read_predictions(output)
    assert list(predictions.columns) == [
        "image_id",
        "source_label",
        "label",
        "class",
        "probability",
        "model_name",
        "model_version",
    ]
    assert predictions["image_id"].tolist() == [str(i) for i in range(N_IMAGES)]
    assert predictions["source_label"].isna().all()  # an idx file gives no labels
    assert predictions["label"].tolist() == _pyfunc_labels(inputs["pixels"])
    assert set(predictions["model_version"]) == {services["version"]}
    assert not [f for f in os.listdir(os.path.dirname(output)) if f != "predictions.parquet"]  # no temp files left

    # Six chunks of 50, each its own task run in the Ray subflow; a worker loads the model for its first chunk only.
    parents = {t["id"] for t in _api(services, "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})}
    [steps] = [r for r in runs.values() if r["parent_task_run_id"] in parents]
    tasks = _api(services, "/task_runs/filter", {"flow_runs": {"id": {"any_": [steps["id"]]}}})
    names = sorted(t["name"].rsplit("-", 1)[0] for t in tasks)
    assert names.count("score-chunk") == 6 and {"resolve-model", "read-images", "write-predictions"} <= set(names)
    chunk_runs = [t["id"] for t in tasks if t["name"].startswith("score-chunk")]
    # Ray workers ship their Prefect logs in batches: give the last batch a bounded time to arrive.
    deadline = time.monotonic() + 60
    while True:
        logs = _api(services, "/logs/filter", {"logs": {"task_run_id": {"any_": chunk_runs}}, "limit": 200})
        loads = [log["message"] for log in logs if "loaded the model" in log["message"]]
        reuses = [log["message"] for log in logs if "reused the model already loaded" in log["message"]]
        if len(loads) + len(reuses) >= 6 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert len(loads) + len(reuses) == 6 and 1 <= len(loads) < 6, loads + reuses
    [artifact] = [a for a in _api(services, "/artifacts/filter", {}) if a["key"] == f"scoring-histogram-{MODEL_NAME}"]
    rows = json.loads(artifact["data"]) if isinstance(artifact["data"], str) else artifact["data"]
    assert sum(row["images"] for row in rows) == N_IMAGES
    assert {row["model"] for row in rows} == {f"{MODEL_NAME} v{services['version']}"}
    counts = predictions["class"].value_counts().to_dict()
    assert {row["class"]: row["images"] for row in rows} == counts


def test_image_folder_input_with_csv_output_names_each_file(services, inputs, tmp_path, ray_session):
    from tasks.domain.predictions_file import read_predictions

    output = str(tmp_path / "photos.csv")
    state = _run_in_process(services, ray_session, input_url=inputs["photos"], output_url=output, chunk_size=128)
    assert state.is_completed(), state.message
    predictions = read_predictions(output)
    summary = state.result()  # the flow's ScoringSummary
    assert (summary.output_url, summary.images, summary.model_version) == (output, N_IMAGES, services["version"])
    assert {c.class_name: c.images for c in summary.histogram} == predictions["class"].value_counts().to_dict()
    assert predictions["image_id"].tolist() == list(inputs["files"])  # each file's path relative to the folder
    assert predictions["source_label"].tolist() == [name.split("/")[0] for name in inputs["files"]]
    assert predictions["label"].tolist() == _pyfunc_labels(list(inputs["files"].values()))
    # the PNGs are the test images themselves: the labels of their pixels
    pngs = [i for i, name in enumerate(inputs["files"]) if name.endswith(".png")]
    order = [int(name.rsplit("/", 1)[1][:3]) for name in inputs["files"]]
    by_pixels = _pyfunc_labels(inputs["pixels"])
    assert [predictions["label"][i] for i in pngs] == [by_pixels[order[i]] for i in pngs]


def test_manifest_on_s3(services, inputs, tmp_path, ray_session):
    from faults.fault_helpers import MotoS3

    from tasks.domain.predictions_file import read_predictions

    names = list(inputs["files"])[:40]
    with MotoS3() as s3:
        # Public objects read anonymously: the Ray workers of this session were started before this moto server,
        # without its credentials in their environment (where a deployment's workers have theirs).
        fs = s3.fs()
        for name in names:
            fs.pipe_file(f"{s3.bucket}/batch/images/{name}", inputs["files"][name], ACL="public-read")
        manifest = pd.DataFrame({"path": [f"images/{n}" for n in names], "label": [n.split("/")[0] for n in names]})
        fs.pipe_file(f"{s3.bucket}/batch/manifest.csv", manifest.to_csv(index=False).encode(), ACL="public-read")
        output = str(tmp_path / "predictions.parquet")
        state = _run_in_process(
            services,
            ray_session,
            input_url=f"s3://{s3.bucket}/batch/manifest.csv",
            output_url=output,
            chunk_size=25,
            storage_options={"endpoint_url": s3.endpoint, "anon": True},
        )
        assert state.is_completed(), state.message
    predictions = read_predictions(output)
    assert predictions["image_id"].tolist() == manifest["path"].tolist()  # each file as the manifest names it
    assert predictions["source_label"].tolist() == manifest["label"].tolist()
    assert predictions["label"].tolist() == _pyfunc_labels([inputs["files"][n] for n in names])


def test_missing_alias_names_the_model_and_how_to_create_a_champion(services, inputs, tmp_path, ray_session):
    output = tmp_path / "never.parquet"
    state = _run_in_process(
        services, ray_session, input_url=inputs["npy"], output_url=str(output), alias="no-such-alias"
    )
    assert state.is_failed()
    for words in (MODEL_NAME, "no alias 'no-such-alias'", "champion", "set_registered_model_alias"):
        assert words in state.message, state.message
    assert not output.exists()
    state = _run_in_process(
        services, ray_session, input_url=inputs["npy"], output_url=str(output), model_name="never-registered"
    )
    assert state.is_failed() and "no registered model 'never-registered'" in state.message, state.message


@pytest.mark.parametrize("kind", ["empty", "garbage", "missing"])
def test_empty_or_unreadable_input_fails_clearly_and_writes_nothing(services, tmp_path, ray_session, kind):
    source = tmp_path / "images.npy"
    if kind == "empty":
        np.save(source, np.zeros((0, 28, 28), dtype=np.uint8))
    elif kind == "garbage":
        source.write_bytes(b"not an array at all")
    output = tmp_path / "out" / "predictions.csv"
    state = _run_in_process(services, ray_session, input_url=str(source), output_url=str(output))
    assert state.is_failed()
    expected = {"empty": "holds no images", "garbage": "is not a readable .npy array", "missing": "does not exist"}
    assert expected[kind] in state.message and str(source) in state.message, state.message
    assert not output.parent.exists() or not os.listdir(output.parent)


@pytest.mark.parametrize(
    "params, words",
    [
        ({"output_url": "/tmp/predictions.json"}, ".parquet or .csv"),
        ({"storage_options": {"secret": "x"}}, "must not hold credentials"),
        ({"chunk_size": 0}, "chunk_size"),
    ],
)
def test_bad_parameters_fail_before_any_task(services, ray_session, params, words):
    state = _run_in_process(services, ray_session, **{"input_url": "/tmp/x.npy", "output_url": "/tmp/p.csv", **params})
    assert state.is_failed() and words in state.message, state.message
