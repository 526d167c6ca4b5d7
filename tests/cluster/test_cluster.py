"""trainlib and the pipeline on a real multi-node Ray cluster started with `ray start`.

One cluster for the module (cluster_harness): the head on 127.0.0.2 (which has the
repository, as the operator's machine does) and a node on 127.0.0.3 that cannot
import trainlib, tasks or flows (the repository is hidden from it by a mount
namespace). Run storage and staged data are on S3 (moto's server over HTTP), whose
endpoint and keys the nodes get from their environment, as a real cluster's nodes
do. MLflow is an `mlflow server` with S3 artifacts, Prefect a `prefect server`. The
node-loss test runs last: it stops a node for good.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from cluster_harness import BIN, HEAD_IP, REPO_ROOT, LocalRayCluster, can_hide_code, free_port
from cluster_jobs import checkpoint_state, expected_total, spread_train_func
from conftest import FASHION_MNIST_MIRROR, start_session_ray
from prefect_helpers import PrefectServer
from tracking.mlflow_helpers import MlflowServer

import trainlib
from trainlib.torch import TorchTrainer

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.long]

NO_NAMESPACES = can_hide_code()
if NO_NAMESPACES:
    pytest.skip(f"a node without the code needs a private mount namespace: {NO_NAMESPACES}", allow_module_level=True)

BUCKET = "trainlib-cluster"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "AKIACLUSTERFAKE",
    "AWS_SECRET_ACCESS_KEY": "cluster-secret-" + uuid.uuid4().hex,
    "AWS_DEFAULT_REGION": "us-east-1",
}
MIRROR = FASHION_MNIST_MIRROR
PROJECT_MODULES = [os.path.join(REPO_ROOT, p) for p in ("trainlib", "tasks", "flows")]


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on 127.0.0.1 with one bucket; its endpoint and keys as environment variables."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = dict(S3_ENV, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name="us-east-1",
    ).create_bucket(Bucket=BUCKET)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # this process is a driver too (reads results back from S3)
    yield env
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()


@pytest.fixture(scope="module")
def cluster(s3):
    """Head 127.0.0.2 (with the repo) and 127.0.0.3 (without it), 1 CPU each, S3 keys in their environment."""
    c = LocalRayCluster(node_env=s3)
    try:
        c.start_head(num_cpus=1)
        c.add_node("127.0.0.3", num_cpus=1, with_code=False)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def services(tmp_path_factory, s3):
    """A Prefect server and an MLflow server (artifacts on S3), both on 127.0.0.1."""
    root = tmp_path_factory.mktemp("cluster-services")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "RAY_ADDRESS"))}
    prefect_server = PrefectServer(root, dict(env, **s3)).start()  # starts while the MLflow server starts
    mlflow_server = MlflowServer(str(root / "mlflow"), artifacts_destination=f"s3://{BUCKET}/mlartifacts")
    try:
        mlflow_server.start()  # this process's environment holds the S3 endpoint and keys (the s3 fixture)
        prefect_server.wait()
        yield {"api_url": prefect_server.api_url, "mlflow_uri": mlflow_server.uri, "root": root}
    finally:
        prefect_server.stop()
        mlflow_server.stop()


@pytest.fixture(scope="module", autouse=True)
def session_ray_back_after_the_module():
    """The tests below connect this process to the cluster; the session's embedded Ray comes back once, at the end."""
    import ray

    was_running = ray.is_initialized()
    yield
    ray.shutdown()
    if was_running:  # as the session fixture left it, for the modules after this one
        start_session_ray()


@contextlib.contextmanager
def connected(cluster: LocalRayCluster, runtime_env: dict):
    """This test process as a driver of the cluster (the session's embedded Ray is shut down meanwhile)."""
    import ray

    ray.shutdown()
    with cluster.token_auth_here():
        ray.init(address=cluster.address, runtime_env=runtime_env, log_to_driver=True)
        try:
            yield ray
        finally:
            ray.shutdown()


def probe_imports(cluster: LocalRayCluster, runtime_env: dict | None = None) -> dict[str, dict[str, bool]]:
    """node IP -> whether a plain Ray task there can import each project package (a fresh driver process)."""
    code = f"""
import importlib.util, json, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address={cluster.address!r}, runtime_env={runtime_env!r}, log_to_driver=False, logging_level="ERROR")

@ray.remote(num_cpus=0)
def probe():
    return {{m: importlib.util.find_spec(m) is not None for m in ("trainlib", "tasks", "flows", "cluster_jobs")}}

found = {{n["NodeManagerAddress"]: ray.get(probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
    n["NodeID"], soft=False)).remote()) for n in ray.nodes() if n["Alive"]}}
print("FOUND=" + json.dumps(found))
"""
    # Run from this folder with the repo on PYTHONPATH, as a careless driver would: Ray then adds
    # the driver's working directory to the workers' path, which must not help the hidden node.
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=180,
        env=cluster.driver_env(),
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("FOUND=")), None)
    assert line, done.stderr[-4000:]
    return json.loads(line[len("FOUND=") :])


def test_node_without_the_code_cannot_import_the_project(cluster):
    found = probe_imports(cluster)
    assert found[HEAD_IP] == {"trainlib": True, "tasks": True, "flows": True, "cluster_jobs": True}
    assert found["127.0.0.3"] == {"trainlib": False, "tasks": False, "flows": False, "cluster_jobs": False}
    # py_modules in the job's runtime_env carry the project there.
    shipped = probe_imports(cluster, {"py_modules": PROJECT_MODULES})
    assert shipped["127.0.0.3"] == {"trainlib": True, "tasks": True, "flows": True, "cluster_jobs": False}


def test_training_function_reaches_a_node_without_its_module(cluster, s3):
    """STRICT_SPREAD over both nodes; cluster_jobs exists only here, trainlib arrives by py_modules."""
    storage = f"s3://{BUCKET}/runs"
    with connected(cluster, {"py_modules": [os.path.join(REPO_ROOT, "trainlib")]}):
        result = TorchTrainer(
            spread_train_func,
            train_loop_config={"steps": 3},
            scaling_config=trainlib.ScalingConfig(num_workers=2, placement_strategy="STRICT_SPREAD"),
            run_config=trainlib.RunConfig(name="shipped-" + uuid.uuid4().hex[:6], storage_path=storage),
        ).fit()
    assert result.error is None
    assert result.metrics["num_nodes"] == 2
    assert sorted(checkpoint_state(result.checkpoint)["nodes"]) == [HEAD_IP, "127.0.0.3"]
    assert result.metrics["total"] == expected_total(3, 2)
    # A cluster's workers preload nothing: the actor's framework start and the function's unpickling ran without the
    # cyclic collector, which is back on, their survivors frozen (bulk_imports.py).
    assert result.metrics["collector"] == [True, True]
    assert result.checkpoint.uri.startswith(f"s3://{BUCKET}/runs/")
    # The run reads back from S3 (as Result.from_path does for any past run): by its URL, or as Ray Train's users
    # do, by its scheme-less path and filesystem.
    assert result.path == result.uri.removeprefix("s3://")
    for back in (
        trainlib.Result.from_path(result.uri),
        trainlib.Result.from_path(result.path, storage_filesystem=result.filesystem),
    ):
        assert back.metrics["step"] == 3 and back.checkpoint.uri == result.checkpoint.uri


# -- the pipeline on the cluster --------------------------------------------------------------------

SMALL = ["--epochs", "1", "--num-workers", "2", "--limit", "128", "--test-limit", "100", "--batch-size", "32"]
needs_data = pytest.mark.skipif(not os.path.isdir(MIRROR), reason=f"the FashionMNIST mirror {MIRROR} is missing")


def pipeline_args(services, tmp_path, model_name: str, ray_address: str) -> list[str]:
    """`python -m flows.main` on the cluster: STRICT_SPREAD ranks, S3 storage, the MLflow server."""
    return [
        "-m",
        "flows.main",
        "--mirrors",
        MIRROR,
        *SMALL,
        "--placement-strategy",
        "STRICT_SPREAD",
        "--ray-address",
        ray_address,
        "--storage-path",
        f"s3://{BUCKET}/pipeline",
        "--mlflow-tracking-uri",
        services["mlflow_uri"],
        "--model-name",
        model_name,
        "--experiment-name",
        model_name,
        "--home",
        str(tmp_path / "home"),
    ]


def pipeline_env(cluster, services, s3) -> dict[str, str]:
    return cluster.driver_env(**s3, PREFECT_API_URL=services["api_url"], PREFECT_SERVER_ALLOW_EPHEMERAL_MODE="false")


def assert_champion_loads(services, s3, model_name: str) -> None:
    """The registered champion loads and predicts in a fresh process that never saw this repo."""
    code = (
        "import mlflow; m = mlflow.pyfunc.load_model('models:/%s@champion'); "
        "out = m.predict(m.input_example); print('PREDICTED', len(out))" % model_name
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHONPATH", "MLFLOW_", "PREFECT_"))}
    env.update(s3, MLFLOW_TRACKING_URI=services["mlflow_uri"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env, cwd="/")
    assert done.returncode == 0 and "PREDICTED" in done.stdout, done.stderr[-4000:]


def assert_registered_on_the_cluster(services, s3, model_name: str) -> None:
    """The run's metrics and champion are in the MLflow server, checkpoints committed on S3, artifacts on S3,
    and the champion loads in a fresh process."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=services["mlflow_uri"])
    champion = client.get_model_version_by_alias(model_name, "champion")
    assert champion.version == "1"
    run = client.get_run(champion.run_id)
    assert "test_accuracy" in run.data.metrics and "val_accuracy" in run.data.metrics
    import fsspec

    fs = fsspec.filesystem("s3")
    committed = fs.glob(f"{BUCKET}/pipeline/{run.data.tags['trainlib.run_name']}/checkpoint_*/.trainlib_commit.json")
    assert committed, fs.ls(f"{BUCKET}/pipeline")
    assert fs.glob(f"{BUCKET}/mlartifacts/**")
    assert_champion_loads(services, s3, model_name)


# The GCS address is the way in of the Ray Jobs test below (the job's driver finds it in RAY_ADDRESS);
# this one takes the Ray Client route. Each is a whole pipeline run (~50 s), so neither is repeated.
@needs_data
@pytest.mark.timeout(900)
def test_pipeline_on_the_cluster_by_ray_client(cluster, services, s3, tmp_path):
    """The whole pipeline by Ray Client (ray://); both nodes train (two STRICT_SPREAD ranks on two nodes), one
    of which never had the code."""
    model_name = "cluster-ray-client"
    address = cluster.client_address
    done = subprocess.run(
        [sys.executable, *pipeline_args(services, tmp_path, model_name, address)],
        capture_output=True,
        text=True,
        timeout=840,
        env=pipeline_env(cluster, services, s3),
        cwd=REPO_ROOT,
    )
    output = done.stdout + done.stderr
    # On failure, the Ray Client servers' logs too: the proxier starts one per client, on the head.
    assert done.returncode == 0, output[-8000:] + "\n" + cluster.session_log_tails("ray_client_server*")
    assert "Test accuracy" in output and f"Ray {address}" in output, output[-4000:]
    print(next((line for line in output.splitlines() if line.startswith("Seconds per stage")), ""))
    assert_registered_on_the_cluster(services, s3, model_name)


@needs_data
@pytest.mark.timeout(900)
def test_pipeline_as_a_ray_job(cluster, services, s3, tmp_path):
    """`ray job submit --working-dir . -- python -m flows.main ...`: the job's driver finds the cluster's GCS
    address in RAY_ADDRESS."""
    model_name = "cluster-job"
    args = [a for a in pipeline_args(services, tmp_path, model_name, "unused") if a not in ("--ray-address", "unused")]
    # The job's environment says where Prefect is; the S3 keys are the nodes' own (never in a job's env).
    runtime_env = {"env_vars": {"PREFECT_API_URL": services["api_url"], "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "false"}}
    done = subprocess.run(
        [
            f"{BIN}/ray",
            "job",
            "submit",
            "--address",
            cluster.dashboard_url,
            "--working-dir",
            REPO_ROOT,
            "--runtime-env-json",
            json.dumps(runtime_env),
            "--",
            "python",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=840,
        env=cluster.driver_env(),
        cwd=REPO_ROOT,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "succeeded" in output, output[-8000:]
    assert "Test accuracy" in output and f"Ray {cluster.address}" in output, output[-4000:]
    print(next((line for line in output.splitlines() if line.startswith("Seconds per stage")), ""))
    assert_registered_on_the_cluster(services, s3, model_name)


# -- node loss: these run last, they stop nodes for good --------------------------------------------


class StopNodeOfRankAfter(trainlib.Callback):
    """Driver-side: after report ``step``, stop (SIGKILL) the non-head node that runs a rank, once."""

    def __init__(self, cluster: LocalRayCluster, step: int):
        self.cluster, self.step = cluster, step
        self.stopped: str | None = None
        self.failures: list[tuple[str, bool]] = []

    def after_report(self, run, report):
        if self.stopped or report.step != self.step:
            return
        ranks_on = checkpoint_state(report.checkpoint)["nodes"]
        victim = next(n for n in self.cluster.nodes if n.ip in ranks_on and n.ip != HEAD_IP and n.alive())
        self.cluster.kill_node(victim)
        self.stopped = victim.ip

    def after_failure(self, run, failure, will_restart):
        self.failures.append((failure.cause, will_restart))


def _spread_trainer(name: str, stopper: StopNodeOfRankAfter, steps: int, placement_timeout_s: float = 60.0):
    return TorchTrainer(
        spread_train_func,
        train_loop_config={"steps": steps, "sleep_s": 0.5, "hold_at_step": stopper.step},
        scaling_config=trainlib.ScalingConfig(
            num_workers=2, placement_strategy="STRICT_SPREAD", placement_timeout_s=placement_timeout_s
        ),
        run_config=trainlib.RunConfig(
            name=name,
            storage_path=f"s3://{BUCKET}/runs",
            callbacks=[stopper],
            failure_config=trainlib.FailureConfig(max_failures=1),
        ),
    )


@pytest.mark.timeout(300)
def test_node_stopped_during_training_restarts_on_the_remaining_nodes(cluster, s3):
    """Three nodes, two ranks: the node of rank 1 is killed; the run resumes on the other two."""
    cluster.add_node("127.0.0.4", num_cpus=1, with_code=False)
    stopper = StopNodeOfRankAfter(cluster, step=2)
    with connected(cluster, {"py_modules": [os.path.join(REPO_ROOT, "trainlib")]}):
        result = _spread_trainer("node-loss-" + uuid.uuid4().hex[:6], stopper, steps=6).fit()
    assert stopper.stopped in ("127.0.0.3", "127.0.0.4")
    assert result.error is None, result.error
    [(cause, will_restart)] = stopper.failures
    assert will_restart and stopper.stopped in cause, cause
    assert result.metrics["attempt"] == 1 and result.metrics["start_step"] >= 2
    assert result.metrics["total"] == expected_total(6, 2)  # resumed exactly from the committed step
    nodes = checkpoint_state(result.checkpoint)["nodes"]
    assert stopper.stopped not in nodes and len(set(nodes)) == 2


@pytest.mark.timeout(300)
def test_node_stopped_without_spare_capacity_fails_with_a_clear_error(cluster, s3):
    """Two nodes left, two STRICT_SPREAD ranks: after one node is killed the group cannot fit again."""
    stopper = StopNodeOfRankAfter(cluster, step=2)
    started = time.monotonic()
    with connected(cluster, {"py_modules": [os.path.join(REPO_ROOT, "trainlib")]}):
        with pytest.raises(trainlib.TrainlibError) as info:
            _spread_trainer("no-room-" + uuid.uuid4().hex[:6], stopper, steps=6, placement_timeout_s=20).fit()
    message = str(info.value)
    assert stopper.stopped and isinstance(info.value, trainlib.ResourcesUnavailableError), message
    assert "STRICT_SPREAD" in message or "Timed out" in message, message
    assert time.monotonic() - started < 150
