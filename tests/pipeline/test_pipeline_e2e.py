"""End-to-end pipeline tests on real services: a Prefect server process, an `mlflow server` process,
a process work pool with `prefect worker`, local Ray, and a few hundred real FashionMNIST images.

The deployment test runs `prefect deploy --all` from prefect.yaml, then two `prefect deployment run`s
executed by `prefect worker start --run-once`: a normal model (becomes champion) and an lr=0 model
(challenger only). The bad-input tests run the flow in this process against the same server.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import FASHION_MNIST_MIRROR, REPO_ROOT, free_port

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

BIN = os.path.dirname(sys.executable)
POOL = "trainlib-process"  # as in prefect.yaml
DEPLOYMENT = "training-pipeline/fashion-mnist-retrain"
SMALL = {"num_workers": 2, "limit": 384, "test_limit": 300, "batch_size": 32}

needs_data = pytest.mark.skipif(not os.path.isdir(FASHION_MNIST_MIRROR),
                                reason=f"the FashionMNIST mirror {FASHION_MNIST_MIRROR} is missing")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _wait_healthy(url: str, process: subprocess.Popen, log_path: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _healthy(url):
            return
        if process.poll() is not None:
            break
        time.sleep(0.3)
    with open(log_path) as f:
        raise RuntimeError(f"{url} did not become healthy; log:\n{f.read()[-3000:]}")


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """A Prefect server (SQLite, own PREFECT_HOME) and an MLflow server, both on 127.0.0.1."""
    root = tmp_path_factory.mktemp("services")
    prefect_port, mlflow_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "RAY_ADDRESS"))}
    env.update(PREFECT_HOME=str(root / "prefect_home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_UI_ENABLED="false")
    logs = {name: str(root / f"{name}.log") for name in ("prefect", "mlflow")}
    with open(logs["prefect"], "wb") as plog, open(logs["mlflow"], "wb") as mlog:
        prefect_server = subprocess.Popen(
            [f"{BIN}/prefect", "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
            stdout=plog, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        mlflow_server = subprocess.Popen(
            [f"{BIN}/mlflow", "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
             "--artifacts-destination", str(root / "mlartifacts"), "--host", "127.0.0.1", "--port", str(mlflow_port),
             "--workers", "1"],
            stdout=mlog, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        api_url = f"http://127.0.0.1:{prefect_port}/api"
        _wait_healthy(f"{api_url}/health", prefect_server, logs["prefect"])
        _wait_healthy(f"http://127.0.0.1:{mlflow_port}/health", mlflow_server, logs["mlflow"])
        client_env = dict(env, PREFECT_API_URL=api_url, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE="false")
        yield {"api_url": api_url, "mlflow_uri": f"http://127.0.0.1:{mlflow_port}", "env": client_env, "root": root}
    finally:
        for process in (prefect_server, mlflow_server):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 15)
        for process in (prefect_server, mlflow_server):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)


def _api(services, path: str, body: dict | None = None):
    request = urllib.request.Request(services["api_url"] + path, data=json.dumps(body or {}).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _cli(services, *args: str, timeout: float = 120) -> str:
    done = subprocess.run([f"{BIN}/prefect", *args], cwd=REPO_ROOT, env=services["env"], capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _flow_runs(services) -> dict[str, dict]:
    return {run["id"]: run for run in _api(services, "/flow_runs/filter", {"limit": 200})}


@contextlib.contextmanager
def _prefect_in_process(services):
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE, temporary_settings

    with temporary_settings({PREFECT_API_URL: services["api_url"], PREFECT_SERVER_ALLOW_EPHEMERAL_MODE: False}):
        yield


def _run_flow_in_process(services, ray_session, **params):
    from flows.params import PipelineParams
    from flows.pipeline import training_pipeline

    with _prefect_in_process(services):
        return training_pipeline(PipelineParams(**params), return_state=True)


@needs_data
@pytest.mark.timeout(480)
def test_deployment_runs_register_champion_and_challenger(services, tmp_path, ray_session):
    from mlflow import MlflowClient

    model_name = "fmnist-e2e"
    base = {**SMALL, "mirrors": [FASHION_MNIST_MIRROR], "storage_path": str(tmp_path / "runs"),
            "data_cache_dir": str(tmp_path / "cache"), "mlflow_tracking_uri": services["mlflow_uri"],
            "model_name": model_name, "experiment_name": "fmnist-e2e"}
    _cli(services, "work-pool", "create", POOL, "--type", "process")
    out = _cli(services, "--no-prompt", "deploy", "--all")
    assert "fashion-mnist-retrain" in out
    [deployment] = [d for d in _api(services, "/deployments/filter", {}) if d["name"] == DEPLOYMENT.split("/")[1]]
    assert deployment["enforce_parameter_schema"] is True
    limit = deployment.get("concurrency_limit") or (deployment.get("global_concurrency_limit") or {}).get("limit")
    assert limit == 1, {k: v for k, v in deployment.items() if "concurrency" in k}
    assert (deployment.get("concurrency_options") or {}).get("collision_strategy") == "ENQUEUE"
    [schedule] = deployment["schedules"]
    assert schedule["schedule"]["cron"] == "0 3 * * 1" and schedule["schedule"]["timezone"] == "Europe/Berlin"

    def run_deployment(**overrides) -> dict:
        out = _cli(services, "deployment", "run", DEPLOYMENT, "--params",
                   json.dumps({"params": {**base, "epochs": 1, **overrides}}))
        flow_run_id = re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)
        started = time.monotonic()
        worker_output = _cli(services, "worker", "start", "--pool", POOL, "--run-once", timeout=300)
        print(f"deployment run took {time.monotonic() - started:.1f} s")
        runs = _flow_runs(services)
        top = runs[flow_run_id]
        assert top["state_type"] == "COMPLETED", f"{top['state']['message']}\n{worker_output[-6000:]}"
        # The Ray subflow: a child of a task run of this flow run.
        parents = {t["id"] for t in _api(services, "/task_runs/filter",
                                         {"flow_runs": {"id": {"any_": [flow_run_id]}}})}
        [steps] = [r for r in runs.values() if r["parent_task_run_id"] in parents]
        return {"top": top, "steps": steps}

    first = run_deployment()
    # Every task run reached this server: the four steps, each COMPLETED, in the Ray subflow.
    steps_run = first["steps"]
    assert steps_run["state_type"] == "COMPLETED"
    tasks = _api(services, "/task_runs/filter", {"flow_runs": {"id": {"any_": [steps_run["id"]]}}})
    assert sorted(t["name"].rsplit("-", 1)[0] for t in tasks) == ["download-dataset", "evaluate", "register", "train"]
    assert {t["state_type"] for t in tasks} == {"COMPLETED"}
    # Rank 0's reports reached the Prefect logs of the train task; artifacts a person can read exist.
    train_run = next(t for t in tasks if t["name"].startswith("train-"))
    logs = _api(services, "/logs/filter", {"logs": {"task_run_id": {"any_": [train_run["id"]]}}, "limit": 200})
    assert any("rank 0 report 1" in log["message"] and "val_accuracy" in log["message"] for log in logs)
    artifact_keys = {a["key"] for a in _api(services, "/artifacts/filter", {}) if a["key"]}
    assert {f"evaluation-{model_name}", f"per-class-accuracy-{model_name}", f"model-registry-{model_name}"} \
        <= artifact_keys

    client = MlflowClient(tracking_uri=services["mlflow_uri"])
    v1 = client.get_model_version_by_alias(model_name, "champion")
    assert v1.version == "1" and client.get_model_version_by_alias(model_name, "challenger").version == "1"
    run = client.get_run(v1.run_id)
    for key in ("loss", "val_accuracy", "test_accuracy", "test_loss", "test_accuracy_class_0"):
        assert key in run.data.metrics, key
    evaluation = {os.path.basename(a.path) for a in client.list_artifacts(v1.run_id, "evaluation")}
    assert {"confusion_matrix.png", "learning_curve.png", "test_report.md"} <= evaluation
    first_accuracy = float(v1.tags["test_accuracy"])
    assert first_accuracy == pytest.approx(run.data.metrics["test_accuracy"], abs=1e-6)
    # Lineage: the data set is the run's input, the usual source tags, one checkpoint copy (the best), the recipe.
    [dataset_input] = run.inputs.dataset_inputs
    assert dataset_input.dataset.name == "fashion-mnist" and v1.tags["dataset_md5"] == dataset_input.dataset.digest
    assert run.data.tags["mlflow.source.name"] == "flows.pipeline:training-pipeline" and "mlflow.user" in run.data.tags
    if os.path.exists(os.path.join(REPO_ROOT, ".git")):
        assert len(run.data.tags["mlflow.source.git.commit"]) == 40
    assert len(client.list_artifacts(v1.run_id, "checkpoints")) == 1
    assert v1.tags["recipe"] == "augmented" and v1.tags["previous_champion_version"] == "none"

    # A worse model (lr=0: the initial weights) becomes challenger, not champion. This run goes
    # in-process on the test's Ray to save a second worker, flow process and Ray start-up.
    state = _run_flow_in_process(services, ray_session, **{**base, "lr": 0.0, "epochs": 1})
    assert state.is_completed(), state.message
    steps2 = next(r for r in _flow_runs(services).values()
                  if r["parent_task_run_id"] in {t["id"] for t in _api(services, "/task_runs/filter", {
                      "flow_runs": {"id": {"any_": [str(state.state_details.flow_run_id)]}}})})
    download2 = next(t for t in _api(services, "/task_runs/filter", {"flow_runs": {"id": {"any_": [steps2["id"]]}}})
                     if t["name"].startswith("download-dataset-"))
    logs2 = _api(services, "/logs/filter", {"logs": {"task_run_id": {"any_": [download2["id"]]}}})
    assert any("4 file(s) from the cache" in log["message"] for log in logs2)  # nothing downloaded again
    v2 = client.get_model_version_by_alias(model_name, "challenger")
    assert v2.version == "2"
    assert float(v2.tags["test_accuracy"]) < first_accuracy
    assert v2.tags["promotion_decision"] == "kept_champion"
    # The champion was scored again in run 2, on the same test images: the same accuracy as in run 1.
    assert float(v2.tags["previous_champion_test_accuracy"]) == pytest.approx(first_accuracy, abs=1e-6)
    assert v2.tags["test_data_md5"] == v1.tags["test_data_md5"]
    assert client.get_model_version_by_alias(model_name, "champion").version == "1"

    # A run that fails mid-pipeline (more workers than the cluster holds) leaves the champion alone.
    started = time.monotonic()
    state = _run_flow_in_process(services, ray_session, **{**base, "num_workers": 64, "epochs": 1})
    assert state.is_failed()
    assert "ResourcesUnavailableError" in state.message or "can hold at most" in state.message, state.message
    assert time.monotonic() - started < 60
    assert client.get_model_version_by_alias(model_name, "champion").version == "1"
    assert client.get_model_version_by_alias(model_name, "challenger").version == "2"


@pytest.mark.parametrize("params, expected", [
    ({"dataset": "cifar10"}, ["dataset", "fashion-mnist"]),
    ({"epochs": 0}, ["epochs", "greater than 0"]),
    ({"num_workers": 0}, ["num_workers", "greater than or equal to 1"]),
])
def test_invalid_parameters_fail_before_any_task(services, ray_session, tmp_path, params, expected):
    from flows.pipeline import training_pipeline

    with _prefect_in_process(services):  # a plain dict, as a deployment run passes it: Prefect validates it
        state = training_pipeline(params={"storage_path": str(tmp_path), **params}, return_state=True)
    assert state.is_failed()
    for word in expected:
        assert word in state.message, state.message
    runs = [r for r in _flow_runs(services).values() if r["id"] == str(state.state_details.flow_run_id)]
    assert runs and runs[0]["state_type"] == "FAILED"
    assert not _api(services, "/task_runs/filter", {"flow_runs": {"id": {"any_": [runs[0]["id"]]}}})


@needs_data
def test_corrupt_mirror_file_names_file_and_both_checksums(services, ray_session, tmp_path):
    mirror = tmp_path / "mirror"
    shutil.copytree(FASHION_MNIST_MIRROR, mirror)
    corrupt = mirror / "train-labels-idx1-ubyte.gz"
    corrupt.write_bytes(gzip.compress(b"not the labels", mtime=0))
    import hashlib

    actual = hashlib.md5(corrupt.read_bytes()).hexdigest()
    state = _run_flow_in_process(services, ray_session, mirrors=[str(mirror)], storage_path=str(tmp_path / "runs"),
                                 data_cache_dir=str(tmp_path / "cache"), **SMALL)
    assert state.is_failed()
    for word in ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe", actual, "checksum mismatch"):
        assert word in state.message, state.message


def test_unreachable_mirrors_list_every_url_tried(services, ray_session, tmp_path):
    closed = f"http://127.0.0.1:{free_port()}/fashion-mnist/"
    missing = str(tmp_path / "no-such-folder")
    started = time.monotonic()
    state = _run_flow_in_process(services, ray_session, mirrors=[closed, missing], storage_path=str(tmp_path / "runs"),
                                 data_cache_dir=str(tmp_path / "cache"), **SMALL)
    assert state.is_failed()
    assert closed.rstrip("/") in state.message and missing in state.message, state.message
    assert time.monotonic() - started < 60
