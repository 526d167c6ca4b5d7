"""The continuous-training loop on real parts: a Prefect server for the module, local Ray, MLflow's SQLite store,
a folder source of real FashionMNIST PNGs.

* A first run trains from scratch and becomes champion, with every gate's outcome in the flow's result.
* The same source again: the run ends Completed in seconds saying "no new data since <digest>", and the Prefect
  API shows no training task run (nothing started on Ray).
* ``force=True`` with ``init_from="champion"``: the run trains anyway, from the champion's weights with the
  fine-tuning schedule; its first step's loss is the champion's (near its last training loss), not a random
  network's (~ln 10), and the version records its parent.
* Deployments applied from prefect.yaml, a process worker: two ``trainlib.data.arrived`` events in a burst give two
  runs, one after the other (the concurrency limit of 1), which skip with no task run; then a new arrival batch
  (``ROOT/batch-001``, 60 + 20 new images) makes ``python -m flows.notify_data`` emit the event once, and the
  triggered run trains and registers a new version whose data digest is the new snapshot's. The trigger's runs are
  shrunk to one epoch on one worker through the automation's API (prefect.yaml keeps its production values).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import FASHION_MNIST_MIRROR, REPO_ROOT
from prefect_helpers import PrefectServer, prefect_api, using_prefect_server

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

needs_data = pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST_MIRROR), reason=f"the FashionMNIST mirror {FASHION_MNIST_MIRROR} is missing"
)
# The default model name of a source folder named "source" (flows.params.default_model_name): the triggered runs,
# which name no model, find this module's champion under it.
MODEL = "source-resnet18"
POOL = "trainlib-process"  # as in prefect.yaml
DEPLOYMENT = "fashion-mnist-retrain"
EVENT = "trainlib.data.arrived"
BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    """A Prefect server, a folder source of 500 real images in one batch, and the pipeline's locations."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))
    from fashion_mnist_to_folder import write_folder

    root = tmp_path_factory.mktemp("loop")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "RAY_ADDRESS", "TRAINLIB_"))}
    server = PrefectServer(root, env).start()
    write_folder(FASHION_MNIST_MIRROR, str(root / "source"), limit=400, test_limit=100, batches=1)
    try:
        server.wait()
        from tasks.domain.home import PipelineHome

        home = PipelineHome.resolve(str(root / "home"), environ={})  # where the deployment's runs look too
        yield {
            "api_url": server.api_url,
            "root": root,
            "source": str(root / "source"),
            "env": dict(
                server.env,
                PREFECT_API_URL=server.api_url,
                PREFECT_SERVER_ALLOW_EPHEMERAL_MODE="false",
                PREFECT_WORKER_QUERY_SECONDS="2",
                TRAINLIB_HOME=home.root,
                PYTHONPATH=REPO_ROOT,
            ),
            "locations": {
                "storage_path": home.storage_path,
                "data_cache_dir": home.data_cache,
                "mlflow_tracking_uri": home.mlflow_tracking_uri,
            },
        }
    finally:
        server.stop()


def _run(loop, **params):
    from flows.params import PipelineParams
    from flows.pipeline import training_pipeline

    small = {"num_workers": 2, "batch_size": 32, "recipe": "tutorial", "epochs": 1, "model_name": MODEL}
    with using_prefect_server(loop["api_url"]):
        return training_pipeline(
            PipelineParams(data=loop["source"], **loop["locations"], **{**small, **params}), return_state=True
        )


def _task_runs_under(loop, flow_run_id: str) -> list[str]:
    """Names of every task run of the flow run and of its subflow runs."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    async def names() -> list[str]:
        async with get_client() as client:
            children = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]))
            )
            ids = [flow_run_id, *(str(c.id) for c in children)]
            found = []
            for run_id in ids:
                from prefect.client.schemas.filters import FlowRunFilterId

                runs = await client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
                found += [t.name for t in runs]
            return found

    with using_prefect_server(loop["api_url"]):
        return asyncio.run(names())


@needs_data
@pytest.mark.timeout(1200)
def test_train_then_skip_an_unchanged_week_then_warm_start_from_the_champion(loop, ray_session):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=loop["locations"]["mlflow_tracking_uri"])

    # 1. From scratch: the first version becomes champion; the gates are in the flow's result.
    first = _run(loop, max_class_drop=0.2, epochs=4)  # enough steps that its loss is well below ln(10)
    assert first.is_completed(), first.message
    summary = first.result()
    assert summary.promoted and summary.model_version == "1"
    assert [g.name for g in summary.gates] == ["margin", "max_class_drop", "newest_slice"]
    newest = summary.gates[-1]
    assert newest.outcome == "reported" and "test images of batch-000" in newest.detail
    champion = client.get_model_version(MODEL, "1")
    assert champion.tags["gate.max_class_drop"].startswith("passed: no champion")
    scratch_first_loss = client.get_run(champion.run_id).data.metrics["first_step_loss"]

    # 2. Nothing new since the champion's snapshot: Completed, saying so, no training task run.
    skipped = _run(loop)
    assert skipped.is_completed() and skipped.message.startswith(
        f"no new data since {champion.tags['data.digest']} (champion version 1): nothing trained"
    ), skipped.message
    assert skipped.result().new_images == 0
    flow_run_id = str(skipped.state_details.flow_run_id)
    assert not any(
        name.startswith(("train", "snapshot-data", "validate-data")) for name in _task_runs_under(loop, flow_run_id)
    )
    assert [str(v.version) for v in client.search_model_versions(f"name = '{MODEL}'")] == ["1"]

    # 3. force=True trains anyway, from the champion's weights, on the fine-tuning schedule (3 epochs -> 1).
    warm = _run(loop, force=True, init_from="champion", epochs=3)
    assert warm.is_completed(), warm.message
    version = client.get_model_version(MODEL, warm.result().model_version)
    assert version.tags["parent_version"] == "1" and version.tags["init_from"] == "champion"
    run = client.get_run(version.run_id)
    warm_first_loss = run.data.metrics["first_step_loss"]
    # A random 10-class network starts near ln(10) = 2.30; the warm one where the champion's training ended (its
    # last epoch's mean loss on the same training images), not near its loss on unseen test images.
    champion_loss = client.get_run(champion.run_id).data.metrics["loss"]
    assert scratch_first_loss > math.log(10) - 0.3, scratch_first_loss
    assert warm_first_loss < champion_loss + 0.3 and warm_first_loss < scratch_first_loss - 1.0, (
        warm_first_loss,
        champion_loss,
        scratch_first_loss,
    )
    assert [m.step for m in client.get_metric_history(version.run_id, "val_accuracy")] == [1]  # one epoch

    # A champion that does not fit the run is a clear error naming each difference, before any training.
    from tasks.domain.warm_start import WarmStartError, prepare_warm_start

    classes = tuple(champion_classes(client))
    with pytest.raises(WarmStartError, match=r"architecture: champion 'resnet18-1ch', this run 'resnet18-1ch-small'"):
        prepare_warm_start(MODEL, loop["locations"]["mlflow_tracking_uri"], "resnet18-1ch-small", classes, 1, "/unused")
    with pytest.raises(WarmStartError, match=r"classes: champion \[.*\], this run \['a', 'b'\]; input channels"):
        prepare_warm_start(MODEL, loop["locations"]["mlflow_tracking_uri"], "resnet18-1ch", ("a", "b"), 3, "/unused")


def champion_classes(client) -> list[str]:
    from tasks.domain.snapshot import read_snapshot

    version = client.get_model_version_by_alias(MODEL, "champion")
    return list(read_snapshot(version.tags["data.snapshot_uri"]).class_names)


# -- data events trigger the deployment ---------------------------------------------------------------------


def _cli(loop, *args: str, timeout: float = 300) -> str:
    done = subprocess.run(args, cwd=REPO_ROOT, env=loop["env"], capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _api(loop, path: str, body: dict | None = None, method: str = "POST"):
    return prefect_api(loop["api_url"], path, body, method)


def _deployment_runs(loop, deployment_id: str) -> list[dict]:
    return _api(loop, "/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [deployment_id]}}})


def _wait_for_completed_runs(loop, deployment_id: str, count: int, worker, timeout_s: float = 420) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        runs = _deployment_runs(loop, deployment_id)
        if len(runs) >= count and all(r["state_type"] in ("COMPLETED", "FAILED", "CRASHED") for r in runs):
            return sorted(runs, key=lambda r: r["start_time"])
        assert worker.poll() is None, (loop["root"] / "worker.log").read_text()[-4000:]
        assert time.monotonic() < deadline, [(r["name"], r["state_type"]) for r in runs]
        time.sleep(1)


@needs_data
@pytest.mark.timeout(900)
def test_data_events_trigger_deployment_runs_and_a_burst_queues(loop):
    """Deployments applied from prefect.yaml: two `trainlib.data.arrived` events in a burst start two runs, one
    after the other, which skip (nothing new since the champion of the test above); then a new arrival batch makes
    `python -m flows.notify_data` emit the event, and its triggered run trains and registers a new version."""
    from mlflow import MlflowClient

    from flows.params import default_model_name
    from tasks.domain.snapshot import read_snapshot, take_snapshot

    assert default_model_name(loop["source"]) == MODEL  # what a triggered run, naming no model, registers under
    client = MlflowClient(tracking_uri=loop["locations"]["mlflow_tracking_uri"])
    versions_before = {v.version for v in client.search_model_versions(f"name = '{MODEL}'")}
    if not versions_before:
        pytest.skip("needs the champion of the test above")
    champion_digest = client.get_model_version_by_alias(MODEL, "champion").tags["data.digest"]
    _cli(loop, f"{BIN}/prefect", "work-pool", "create", POOL, "--type", "process")
    _cli(loop, f"{BIN}/prefect", "--no-prompt", "deploy", "--all")
    [deployment] = [d for d in _api(loop, "/deployments/filter") if d["name"] == DEPLOYMENT]
    assert deployment["concurrency_options"]["collision_strategy"] == "ENQUEUE"
    [automation] = [a for a in _api(loop, "/automations/filter") if a["trigger"].get("expect") == [EVENT]]
    _shrink_triggered_runs(loop, automation)

    with open(loop["root"] / "worker.log", "ab") as log:
        worker = subprocess.Popen(
            [f"{BIN}/prefect", "worker", "start", "--pool", POOL],
            cwd=REPO_ROOT,
            env=loop["env"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    notify = [sys.executable, "-m", "flows.notify_data", loop["source"]]
    try:
        # A burst: two events at once, two runs; the deployment's limit of 1 makes the second wait for the first.
        # Nothing arrived since the champion's snapshot: each ends in seconds, nothing started on Ray. (Before the new
        # batch: after it, a run skips only when the triggered version became champion, which is the gates' call.)
        for _ in range(2):
            assert "emitted" in _cli(loop, *notify, "--always")
        burst = _wait_for_completed_runs(loop, deployment["id"], 2, worker)
        for run in burst:
            assert run["state_type"] == "COMPLETED" and run["parameters"]["params"]["data"] == loop["source"], run
            assert run["state"]["message"].startswith(f"no new data since {champion_digest}"), run["state"]
            assert not _task_runs_under(loop, run["id"])
        assert burst[0]["end_time"] <= burst[1]["start_time"], [(r["start_time"], r["end_time"]) for r in burst]

        # A new arrival batch changes the digest: the event fires once, and its run trains and registers.
        sys.path.insert(0, os.path.join(REPO_ROOT, "examples"))
        from fashion_mnist_to_folder import write_folder

        write_folder(FASHION_MNIST_MIRROR, os.path.join(loop["source"], "batch-001"), 60, 20, skip=400, test_skip=100)
        assert "emitted trainlib.data.arrived" in _cli(loop, *notify)
        assert "unchanged" in _cli(loop, *notify)  # the same digest again: no second event
        [*_, triggered] = _wait_for_completed_runs(loop, deployment["id"], 3, worker)
        assert triggered["state_type"] == "COMPLETED", triggered["state"]
        assert "train" in {name.rsplit("-", 1)[0] for name in _task_runs_under(loop, triggered["id"])}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)

    [version] = [v for v in client.search_model_versions(f"name = '{MODEL}'") if v.version not in versions_before]
    assert version.tags["prefect.flow_run_id"] == triggered["id"]
    snapshot = read_snapshot(version.tags["data.snapshot_uri"])
    assert version.tags["data.digest"] == snapshot.digest != champion_digest
    assert snapshot.digest == take_snapshot(loop["source"], cache_dir=loop["locations"]["data_cache_dir"]).digest
    assert sum(1 for e in snapshot.entries if e.batch == "batch-001") == 80
    assert version.tags["promotion_decision"] in ("promoted", "kept_champion"), version.tags


def _shrink_triggered_runs(loop, automation: dict) -> None:
    """Check that the deployment's trigger passes prefect.yaml's parameters, then make its runs small (one epoch of
    the tutorial recipe on one worker) by updating the automation through the API, as an operator could;
    prefect.yaml's production values stay as they are."""
    [action] = automation["actions"]
    assert action["type"] == "run-deployment" and action["parameters"]["params"]["epochs"] == 10, action
    data = action["parameters"]["params"]["data"]
    action["parameters"] = {
        "params": {"data": data, "epochs": 1, "recipe": "tutorial", "batch_size": 64, "num_workers": 1}
    }
    fields = (
        "name",
        "description",
        "enabled",
        "tags",
        "trigger",
        "actions",
        "actions_on_trigger",
        "actions_on_resolve",
    )
    _api(loop, f"/automations/{automation['id']}", {k: automation[k] for k in fields}, method="PUT")
