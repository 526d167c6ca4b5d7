"""The training pipeline on a user's data, on real parts: a Prefect server, local Ray, MLflow's SQLite store.

* FashionMNIST as a folder source (PNGs written by examples/fashion_mnist_to_folder.py, two arrival batches):
  trained, evaluated and registered; the version carries ``data.digest`` and ``data.snapshot_uri``, the MLflow
  run the snapshot as its input and the validation report; Prefect shows the report. Files added afterwards
  do not reach a re-run of the same run: it reads its own snapshot.
  A class that appears afterwards stops the next run before training, with the message.
* A generated RGB 32x32 source with 3 classes: the network takes 3 channels and has 3 outputs, trained and
  evaluated on the snapshot its run had taken before more images arrived (registering it needs the model side
  of issue 48: xfail until that is merged).
* A missing source stops the run before any task with a message naming ``data``, the path and the fix, and
  nothing reaches the registry.
* The same 192 real FashionMNIST PNGs as three more sources: a CSV manifest on S3 (moto) over flat file names,
  a folder on S3 with train/ and test/ folders, and a Parquet manifest on local disk without splits. Ray is
  restarted with the endpoint and fake credentials in its environment, as a cluster's nodes have them. Each is
  trained, evaluated and registered with its data version; a fresh process without the project loads each champion
  with ``mlflow.pyfunc`` and predicts class names from the test PNGs' bytes, giving the evaluate step's confusion
  matrix exactly. Neither fake AWS key is in any file the runs left (MLflow's store and artifacts, Prefect's
  database with the parameters and logs, run storage) nor in the Ray logs.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import pickle
import subprocess
import sys

import pytest
from conftest import FASHION_MNIST_MIRROR, REPO_ROOT, start_session_ray
from data_helpers import (
    CLASS_COLORS,
    FAKE_ACCESS_KEY,
    FAKE_SECRET_KEY,
    moto_s3_env,
    png_bytes,
    shape_image,
    write_shapes,
)
from model.model_helpers import mlflow_models_serve, post_invocations
from prefect_helpers import PrefectServer, prefect_api, using_prefect_server

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

SMALL = {"num_workers": 2, "epochs": 1, "batch_size": 32}

needs_data = pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST_MIRROR), reason=f"the FashionMNIST mirror {FASHION_MNIST_MIRROR} is missing"
)


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """A Prefect server (no UI) and this module's pipeline home (MLflow's SQLite store in it)."""
    root = tmp_path_factory.mktemp("data-services")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "RAY_ADDRESS", "TRAINLIB_"))}
    server = PrefectServer(root, env).start()
    try:
        server.wait()
        home = root / "home"
        yield {"api_url": server.api_url, "root": root, "mlflow_uri": f"sqlite:///{home}/mlflow.db", "home": home}
    finally:
        server.stop()


def _run(services, **params):
    from flows.params import PipelineParams
    from flows.pipeline import training_pipeline

    defaults = {
        "storage_path": str(services["root"] / "runs"),
        "data_cache_dir": str(services["root"] / "cache"),
        "mlflow_tracking_uri": services["mlflow_uri"],
        **SMALL,
    }
    with using_prefect_server(services["api_url"]):
        return training_pipeline(PipelineParams(**{**defaults, **params}), return_state=True)


def _api(services, path: str, body: dict) -> list[dict]:
    return prefect_api(services["api_url"], path, body)


def _mlflow(services):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=services["mlflow_uri"])


def _versions(services, model_name: str) -> list:
    return _mlflow(services).search_model_versions(f"name='{model_name}'")


@pytest.fixture(scope="module")
def fashion_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fashion") / "fashion-folder"
    script = os.path.join(REPO_ROOT, "examples", "fashion_mnist_to_folder.py")
    done = subprocess.run(
        [sys.executable, script, FASHION_MNIST_MIRROR, str(folder), "--limit", "320", "--batches", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Wrote 384 PNG(s)" in done.stdout
    return folder


@needs_data
def test_a_folder_source_is_trained_evaluated_and_registered_with_its_data_version(
    services, ray_session, fashion_folder
):
    from tasks.domain.snapshot import read_snapshot

    state = _run(services, data=str(fashion_folder), run_name="fashion-folder-1", model_name="fashion-folder")
    assert state.is_completed(), state.message
    summary = state.result()
    snapshot_uri = str(services["root"] / "runs" / "snapshots" / "fashion-folder-1.parquet")
    snapshot = read_snapshot(snapshot_uri)
    assert summary.data_digest == snapshot.digest and len(snapshot.entries) == 384
    assert {e.batch for e in snapshot.entries} == {"batch-000", "batch-001"}
    assert summary.stage_times.train.seconds > 0 and 0 <= summary.test_accuracy <= 1

    (version,) = _versions(services, "fashion-folder")
    assert version.tags["data.digest"] == snapshot.digest
    assert version.tags["data.snapshot_uri"] == snapshot_uri
    run = _mlflow(services).get_run(version.run_id)
    (data_input,) = run.inputs.dataset_inputs
    assert data_input.dataset.digest == snapshot.digest[:32] and data_input.dataset.name == "fashion-folder"
    profile = json.loads(data_input.dataset.profile)
    assert profile["counts"]["Trouser"] == snapshot.counts()["Trouser"]
    artifacts = {a.path for a in _mlflow(services).list_artifacts(run.info.run_id, "data")}
    assert {"data/validation.md", "data/validation_classes.json", "data/counts.json"} <= artifacts
    report = _mlflow(services).download_artifacts(run.info.run_id, "data/validation.md", str(services["root"]))
    assert snapshot.digest in open(report).read()

    prefect_artifacts = _api(
        services, "/artifacts/filter", {"artifacts": {"key": {"any_": ["data-validation-fashion-folder"]}}}
    )
    rows = json.loads(prefect_artifacts[0]["data"])
    assert {r["class"] for r in rows} == set(snapshot.class_names) and sum(r["train"] for r in rows) > 250

    # Files that arrive later do not reach a re-run of this run: it reads its own snapshot back.
    from PIL import Image

    for label in snapshot.class_names[:3]:
        for split in ("train", "test"):
            folder = fashion_folder / "batch-002" / split / label
            folder.mkdir(parents=True)
            Image.new("L", (28, 28), 200).save(folder / "late.png")
    again = _run(services, data=str(fashion_folder), run_name="fashion-folder-1", model_name="fashion-folder")
    assert again.is_completed(), again.message
    assert again.result().data_digest == snapshot.digest
    assert read_snapshot(snapshot_uri) == snapshot
    assert len(_versions(services, "fashion-folder")) == 1  # the same MLflow run: registered once

    # A class that appeared against the champion's snapshot stops the next run before training.
    new_class = fashion_folder / "batch-003" / "train" / "Hat"
    new_class.mkdir(parents=True)
    for i in range(3):
        Image.new("L", (28, 28), 10 * i).save(new_class / f"{i}.png")
    stopped = _run(services, data=str(fashion_folder), run_name="fashion-folder-2", model_name="fashion-folder")
    assert stopped.is_failed()
    assert "classes changed against the champion's snapshot" in stopped.message, stopped.message
    assert "new ['Hat']" in stopped.message and "allow_class_changes=true" in stopped.message
    assert len(_versions(services, "fashion-folder")) == 1
    assert not (services["root"] / "runs" / "fashion-folder-2").exists()


def test_an_rgb_source_trains_a_three_channel_network_on_the_snapshot_its_run_took_first(
    services, ray_session, tmp_path
):
    import torch

    import trainlib
    from tasks.domain.snapshot import take_snapshot, write_snapshot

    source = tmp_path / "shapes"
    write_shapes(source, per_class=40, size=32, rgb=True)
    # The run's first attempt took its snapshot and stopped before training; then more images arrived.
    first = take_snapshot(str(source), cache_dir=str(tmp_path / "cache"))
    write_snapshot(first, str(services["root"] / "runs" / "snapshots" / "shapes-1.parquet"))
    write_shapes(source, per_class=10, size=32, rgb=True, start=40)

    state = _run(services, data=str(source), run_name="shapes-1", model_name="shapes", recipe="tutorial")
    services["rgb_state"] = state
    result = trainlib.Result.from_path(str(services["root"] / "runs" / "shapes-1"))
    with result.checkpoint.as_directory() as folder:
        weights = torch.load(os.path.join(folder, "model.pt"), weights_only=True)
    assert weights["conv1.weight"].shape[1] == 3 and weights["fc.weight"].shape[0] == 3
    (run,) = _mlflow(services).search_runs(
        [_mlflow(services).get_experiment_by_name("shapes").experiment_id], "attributes.run_name = 'shapes-1'"
    )
    assert 0 <= run.data.metrics["test_accuracy"] <= 1  # evaluated on the snapshot's test split
    report = _mlflow(services).download_artifacts(run.info.run_id, "evaluation/test_report.json", str(tmp_path))
    assert json.load(open(report))["num_images"] == len(first.split("test"))  # none of the later images
    (data_input,) = run.inputs.dataset_inputs
    assert data_input.dataset.digest == first.digest[:32], "trained on the snapshot taken before the new images"
    assert json.loads(data_input.dataset.profile)["counts"] == first.counts()


@pytest.mark.timeout(600)  # includes starting `mlflow models serve`
def test_the_rgb_model_is_registered_with_its_data_version_and_served_on_base64_pngs(services, tmp_path):
    state = services["rgb_state"]
    assert state.is_completed(), state.message
    (version,) = _versions(services, "shapes")
    assert version.tags["data.digest"] == state.result().data_digest
    # What a client sends: new PNGs of each class (never seen in training), base64 in `mlflow models serve`'s JSON.
    kinds = list(CLASS_COLORS)
    texts = [base64.b64encode(png_bytes(shape_image(kind, 900 + i))).decode() for i in range(4) for kind in kinds]
    with mlflow_models_serve("models:/shapes@champion", services["mlflow_uri"], tmp_path) as url:
        status, body = post_invocations(url, {"dataframe_split": {"columns": ["image"], "data": [[t] for t in texts]}})
    assert status == 200, body
    rows = body["predictions"]
    assert len(rows) == len(texts) and {row["class"] for row in rows} <= set(kinds)
    assert all(len(row["probabilities"]) == len(kinds) for row in rows)


def test_a_missing_source_fails_before_any_task_with_the_parameter_path_and_fix(services, ray_session, tmp_path):
    missing = tmp_path / "no-such-folder"
    state = _run(services, data=str(missing), model_name="never-registered")
    assert state.is_failed()
    assert f"data='{missing}' does not exist" in state.message and "Fix:" in state.message, state.message
    flow_run_id = str(state.state_details.flow_run_id)
    assert not _api(services, "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})
    assert not _versions(services, "never-registered")


# -- A manifest and a folder on S3 (moto), a manifest on local disk --------------------------------------------

BUCKET = "trainlib-pipeline-data"


def _write_fashion_folder(out, limit: int) -> int:
    """examples/fashion_mnist_to_folder.py's ``write_folder``: ``out/{train,test}/<class>/<n>.png``."""
    path = os.path.join(REPO_ROOT, "examples", "fashion_mnist_to_folder.py")
    spec = importlib.util.spec_from_file_location("fashion_mnist_to_folder", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_folder(FASHION_MNIST_MIRROR, str(out), limit=limit)


@pytest.fixture(scope="module")
def fashion_sources(ray_session, tmp_path_factory):
    """192 real FashionMNIST PNGs (160 train, 32 test) as three sources: a folder on moto S3, a CSV manifest on S3
    over flat file names (the labels and splits only in the manifest), and a Parquet manifest on local disk naming
    the files of a local folder (no split column: split by content hash).

    The endpoint and the credentials are in the environment before Ray (re)starts, so its workers, where the steps
    list and read the files, find them there as a cluster's nodes would; the session's Ray comes back after."""
    import pandas as pd
    import ray
    import s3fs

    root = tmp_path_factory.mktemp("fashion-sources")
    folder = root / "fashion"
    assert _write_fashion_folder(folder, limit=160) == 192
    files = sorted(folder.rglob("*.png"))
    rows = [
        {"path": p.relative_to(folder).as_posix(), "label": p.parent.name, "split": p.parent.parent.name} for p in files
    ]
    flat = [{**row, "path": f"images/{i:04d}.png"} for i, row in enumerate(rows)]
    local_manifest = root / "fashion-local.parquet"
    pd.DataFrame([{"path": f"fashion/{r['path']}", "label": r["label"]} for r in rows]).to_parquet(local_manifest)
    counts = {label: {"train": 0, "test": 0} for label in sorted({r["label"] for r in rows})}
    for row in rows:
        counts[row["label"]][row["split"]] += 1
    try:
        with moto_s3_env(BUCKET):
            start_session_ray()
            fs = s3fs.S3FileSystem()
            fs.put(str(folder) + "/", f"{BUCKET}/fashion-s3/", recursive=True)
            fs.pipe({f"{BUCKET}/catalog/{r['path']}": p.read_bytes() for r, p in zip(flat, files, strict=True)})
            fs.pipe_file(f"{BUCKET}/catalog/fashion-manifest.csv", pd.DataFrame(flat).to_csv(index=False).encode())
            yield {
                "folder": f"s3://{BUCKET}/fashion-s3",
                "manifest": f"s3://{BUCKET}/catalog/fashion-manifest.csv",
                "local_manifest": str(local_manifest),
                "local_root": str(root),
                "counts": counts,
                "ray_logs": ray._private.worker._global_node.get_logs_dir_path(),
            }
    finally:
        start_session_ray()


def _trained_and_registered(services, data: str, run_name: str, **params):
    """Run the pipeline on ``data``; check its registered version's data tags, MLflow input and evaluation, and
    return the summary and the run's snapshot."""
    from tasks.domain.snapshot import read_snapshot

    state = _run(services, data=data, run_name=run_name, **params)
    assert state.is_completed(), state.message
    summary = state.result()
    (version,) = _versions(services, summary.model_name)
    snapshot_uri = str(services["root"] / "runs" / "snapshots" / f"{run_name}.parquet")
    assert version.tags["data.snapshot_uri"] == snapshot_uri and summary.promoted  # the first version: champion
    snapshot = read_snapshot(snapshot_uri)
    assert version.tags["data.digest"] == summary.data_digest == snapshot.digest
    run = _mlflow(services).get_run(version.run_id)
    (data_input,) = run.inputs.dataset_inputs
    assert data_input.dataset.digest == snapshot.digest[:32] and data in data_input.dataset.source
    folder = services["root"] / "downloads" / run_name
    folder.mkdir(parents=True)
    report = json.load(
        open(_mlflow(services).download_artifacts(run.info.run_id, "evaluation/test_report.json", str(folder)))
    )
    assert report["num_images"] == len(snapshot.split("test")) and report["accuracy"] == pytest.approx(
        summary.test_accuracy
    )
    services.setdefault("source_runs", {})[summary.model_name] = (snapshot_uri, report)
    return summary, snapshot


@needs_data
def test_a_manifest_on_s3_is_trained_evaluated_and_registered_with_its_data_version(services, fashion_sources):
    summary, snapshot = _trained_and_registered(services, fashion_sources["manifest"], "fashion-manifest-1")
    assert summary.model_name == "fashion-manifest-resnet18"
    assert snapshot.root == f"s3://{BUCKET}/catalog" and snapshot.counts() == fashion_sources["counts"]
    assert all(e.path.startswith("images/") for e in snapshot.entries)  # the labels came from the manifest


@needs_data
def test_a_folder_on_s3_and_a_manifest_on_local_disk_are_trained_and_registered(services, fashion_sources):
    folder, folder_snapshot = _trained_and_registered(
        services, fashion_sources["folder"], "fashion-s3-1", num_workers=1
    )
    assert folder.model_name == "fashion-s3-resnet18" and folder_snapshot.counts() == fashion_sources["counts"]
    manifest, manifest_snapshot = _trained_and_registered(
        services, fashion_sources["local_manifest"], "fashion-local-1", num_workers=1
    )
    assert manifest.model_name == "fashion-local-resnet18" and manifest_snapshot.root == fashion_sources["local_root"]
    # The same images: the same content hashes; the local manifest has no split column, so its split is by hash.
    assert manifest_snapshot.hashes == folder_snapshot.hashes and len(manifest_snapshot.entries) == 192
    assert 0 < len(manifest_snapshot.split("test")) < 96


FRESH_PREDICT = """
import json, pickle, sys
for name in ("tasks", "flows", "trainlib"):  # a client's process: the project is not importable
    sys.modules[name] = None
import mlflow, pandas as pd
out = {}
for uri, images in pickle.load(open(sys.argv[1], "rb")).items():
    out[uri] = mlflow.pyfunc.load_model(uri).predict(pd.DataFrame({"image": images}))["class"].tolist()
print("RESULT " + json.dumps(out))
"""


@needs_data
def test_each_registered_model_predicts_class_names_from_png_bytes_in_a_fresh_process(services, tmp_path):
    """The test PNGs of each run's snapshot, as bytes, to its champion loaded by a process without the project: the
    predicted class names give the evaluate step's confusion matrix exactly."""
    from tasks.domain.snapshot import read_snapshot
    from tasks.domain.snapshot_files import SnapshotReader

    runs = services.get("source_runs", {})
    assert set(runs) == {"fashion-manifest-resnet18", "fashion-s3-resnet18", "fashion-local-resnet18"}
    inputs, truths = {}, {}
    for model_name, (snapshot_uri, _) in runs.items():
        snapshot = read_snapshot(snapshot_uri)
        tests = sorted(snapshot.split("test"), key=lambda e: e.path)  # the evaluate step's order
        inputs[f"models:/{model_name}@champion"] = SnapshotReader(snapshot, str(tmp_path / "cache")).read_many(tests)
        truths[model_name] = (snapshot.class_names, [e.label for e in tests])
    (tmp_path / "inputs.pkl").write_bytes(pickle.dumps(inputs))
    (tmp_path / "fresh.py").write_text(FRESH_PREDICT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("AWS_")}
    env["MLFLOW_TRACKING_URI"] = services["mlflow_uri"]
    done = subprocess.run(
        [sys.executable, "fresh.py", "inputs.pkl"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    predicted = json.loads(done.stdout.split("RESULT ", 1)[1])
    for model_name, (_, report) in runs.items():
        class_names, labels = truths[model_name]
        classes = predicted[f"models:/{model_name}@champion"]
        assert len(classes) == len(labels) and set(classes) <= set(class_names), model_name
        matrix = [[0] * len(class_names) for _ in class_names]
        for label, got in zip(labels, classes, strict=True):
            matrix[class_names.index(label)][class_names.index(got)] += 1
        assert matrix == report["confusion_matrix"], model_name


@needs_data
def test_no_aws_credential_reaches_mlflow_prefect_run_storage_or_the_ray_logs(services, fashion_sources):
    """Every file the runs left (MLflow's store and artifacts, Prefect's database with the flow runs' parameters
    and logs, run storage, the data cache) and the Ray logs, read as bytes, hold neither fake AWS key."""
    assert services.get("source_runs"), "the runs on the S3 sources came first"
    secrets = (FAKE_SECRET_KEY.encode(), FAKE_ACCESS_KEY.encode())
    leaks, records = [], 0
    for folder in (services["root"], fashion_sources["ray_logs"]):
        for dirpath, _, names in os.walk(folder):
            for name in names:
                with contextlib.suppress(OSError), open(os.path.join(dirpath, name), "rb") as f:
                    data = f.read()
                records += fashion_sources["manifest"].encode() in data
                leaks += [f"{dirpath}/{name}" for secret in secrets if secret in data]
    assert records >= 3, "the runs' records (MLflow's store, Prefect's database, the logs) were among the files read"
    assert not leaks, leaks
