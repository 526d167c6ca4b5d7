"""End-to-end pipeline tests on real services: one Prefect server process (with its UI) for the module,
a process work pool with `prefect worker`, local Ray, MLflow's SQLite store in the pipeline's home, and
a few hundred real FashionMNIST images.

* The main command and the scheduled deployment share one home, so one registry: a `python -m flows.main`
  run makes the champion, then `prefect deployment run` through a worker registers a challenger judged
  against it. That deployment run is SIGKILLed during epoch 2 of 3 and retried: it continues its training
  run from the committed checkpoint and registers once.
* A failing run notifies a local HTTP receiver through a Prefect automation and a webhook block.
* The flow run page, in headless Chromium, shows the task runs and the artifacts.
* Bad input is refused at the boundary: the command line, the server (deployment parameters), the flow.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest
from conftest import FASHION_MNIST_MIRROR, REPO_ROOT, free_port
from prefect_helpers import PrefectServer, prefect_api, using_prefect_server

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

BIN = os.path.dirname(sys.executable)
POOL = "trainlib-process"  # as in prefect.yaml
DEPLOYMENT = "training-pipeline/fashion-mnist-retrain"
SMALL = {"num_workers": 2, "limit": 384, "test_limit": 300, "batch_size": 32}
UI_TIMEOUT_MS = 60_000

needs_data = pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST_MIRROR), reason=f"the FashionMNIST mirror {FASHION_MNIST_MIRROR} is missing"
)


def _chromium() -> str | None:
    return shutil.which("chromium") or (os.path.exists("/usr/bin/chromium") and "/usr/bin/chromium") or None


def _kill_session(sid: int) -> None:
    """SIGKILL every process left in session ``sid`` (a worker's flow-run process and the Ray it started)."""
    import psutil

    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getsid(process.pid) == sid:
                process.kill()


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    """A Prefect server (SQLite, own PREFECT_HOME, UI on) on 127.0.0.1, and the pipeline's home for this module."""
    root = tmp_path_factory.mktemp("services")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "RAY_ADDRESS", "TRAINLIB_"))}
    server = PrefectServer(root, env, ui=True).start()
    try:
        server.wait()
        home = root / "trainlib_home"
        client_env = dict(
            server.env,
            PREFECT_API_URL=server.api_url,
            PREFECT_SERVER_ALLOW_EPHEMERAL_MODE="false",
            TRAINLIB_HOME=str(home),
            PYTHONPATH=REPO_ROOT,
        )
        yield {
            "api_url": server.api_url,
            "ui_url": server.ui_url,
            "env": client_env,
            "root": root,
            "home": home,
            "mlflow_uri": f"sqlite:///{home}/mlflow.db",
            "results": {},
        }
    finally:
        server.stop()


@pytest.fixture(scope="module")
def deployed(services):
    """The work pool and the deployments of prefect.yaml, on the module's server."""
    _cli(services, "work-pool", "create", POOL, "--type", "process")
    out = _cli(services, "--no-prompt", "deploy", "--all")
    assert "fashion-mnist-retrain" in out
    return services


def _api(services, path: str, body: dict | None = None, method: str = "POST"):
    return prefect_api(services["api_url"], path, body, method)


def _cli(services, *args: str, timeout: float = 120, check: bool = True) -> str:
    done = subprocess.run(
        [f"{BIN}/prefect", *args], cwd=REPO_ROOT, env=services["env"], capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def _flow_run(services, flow_run_id: str) -> dict:
    return _api(services, f"/flow_runs/{flow_run_id}", method="GET")


def _steps_run(services, flow_run_id: str) -> dict:
    """The Ray subflow (pipeline-steps) of a top-level flow run: the newest child of one of its task runs."""
    parents = [t["id"] for t in _api(services, "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})]
    children = _api(services, "/flow_runs/filter", {"flow_runs": {"parent_task_run_id": {"any_": parents}}})
    return max(children, key=lambda r: r["created"])


def _task_runs(services, flow_run_id: str) -> list[dict]:
    return _api(services, "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}})


def _logs(services, **filters) -> list[str]:
    body = {"logs": {k: {"any_": v} for k, v in filters.items()}, "limit": 200}
    return [log["message"] for log in _api(services, "/logs/filter", body)]


def _start_deployment_run(services, params: dict) -> str:
    out = _cli(services, "deployment", "run", DEPLOYMENT, "--params", json.dumps({"params": params}))
    return re.search(r"UUID:\s*([0-9a-f-]{36})", out).group(1)


def _start_worker(services) -> subprocess.Popen:
    """`prefect worker start --run-once` in its own session (kill what it leaves with _kill_session)."""
    with open(services["root"] / "worker.log", "ab") as log:
        return subprocess.Popen(
            [f"{BIN}/prefect", "worker", "start", "--pool", POOL, "--run-once"],
            cwd=REPO_ROOT,
            env=services["env"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _run_worker_once(services, timeout_s: float = 420) -> str:
    """One worker run to its end; every process it left behind is killed after. Returns the log's tail."""
    worker = _start_worker(services)
    try:
        worker.wait(timeout=timeout_s)
    finally:
        _kill_session(worker.pid)
    with open(services["root"] / "worker.log") as f:
        return f.read()[-6000:]


def _run_flow_in_process(services, ray_session, **params):
    from flows.params import PipelineParams
    from flows.pipeline import training_pipeline

    with using_prefect_server(services["api_url"]):
        return training_pipeline(PipelineParams(**params), return_state=True)


def _mlflow(services):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=services["mlflow_uri"])


# -- one home, one registry; a killed deployment run resumes when retried ---------------------------------


def _metrics_epochs(run_folder) -> list[int]:
    path = run_folder / "metrics.jsonl"
    if not path.is_file():
        return []
    epochs = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):  # a line being appended right now
            epochs.append(json.loads(line)["metrics"]["epoch"])
    return epochs


def _flow_run_process(worker_pid: int, flow_run_id: str):
    import psutil

    for child in psutil.Process(worker_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if child.environ().get("PREFECT__FLOW_RUN_ID") == flow_run_id:
                return child
    return None


def _kill_during_epoch_2(services, flow_run_id: str, run_folder) -> list[int]:
    """Run the deployment's flow run with a worker and SIGKILL its flow-run process (the Ray driver) during
    epoch 2; return the epochs committed at the kill, once the server knows the run crashed."""
    worker = _start_worker(services)
    try:
        deadline = time.monotonic() + 400
        while _metrics_epochs(run_folder) != [0]:
            assert time.monotonic() < deadline and worker.poll() is None, "epoch 1 never committed"
            time.sleep(0.1)
        time.sleep(1.0)  # inside epoch 2 (an epoch takes several seconds here)
        process = _flow_run_process(worker.pid, flow_run_id)
        assert process is not None
        process.kill()
        killed_during = _metrics_epochs(run_folder)
        # The worker reports the crash at once; its own exit takes seconds more and tells nothing.
        deadline = time.monotonic() + 60
        while _flow_run(services, flow_run_id)["state_type"] != "CRASHED":
            assert time.monotonic() < deadline, _flow_run(services, flow_run_id)["state"]
            time.sleep(0.3)
    finally:
        _kill_session(worker.pid)
    return killed_during


@pytest.mark.long
@needs_data
@pytest.mark.timeout(900)
def test_main_command_and_a_killed_then_retried_deployment_run_share_one_registry(deployed):
    """`make run` makes the champion; the scheduled deployment, run by a worker, is SIGKILLed during epoch 2 of
    3, retried as the UI's Retry button does, continues its training run from the committed checkpoint and
    registers once, as a challenger judged against the first run's champion in the same registry.

    One test, because each pipeline run through a worker costs a minute of the suite's two cores: the
    deployment run that shares the registry is the one that is killed and retried."""
    services = deployed
    model_name = "fashion-mnist-resnet18"  # the default: neither run names a registry or a model
    # The tutorial's recipe: in 6 steps it learns something, which the default one-cycle recipe does not,
    # so the lr=0 challenger below is reliably worse than the champion.
    args = [f"--{k.replace('_', '-')}={v}" for k, v in {**SMALL, "recipe": "tutorial"}.items()]

    # 1. `make run`: the main command, on the module's Prefect server, with TRAINLIB_HOME as its only hint.
    done = subprocess.run(
        [sys.executable, "-m", "flows.main", "--mirrors", FASHION_MNIST_MIRROR, "--epochs", "1", *args],
        cwd=REPO_ROOT,
        env=services["env"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    assert f"{model_name} version 1: no champion yet" in out
    # Rank 0's progress reached the terminal, from the flow process (no Ray prefix on those lines).
    progress_lines = [line for line in out.splitlines() if "Training: epoch 1/1, step" in line]
    assert progress_lines and not any("pid=" in line for line in progress_lines), out[-4000:]
    assert "images/s" in progress_lines[-1] and "ETA" in progress_lines[-1]
    ray_prefixed = [line for line in out.splitlines() if "pid=" in line]
    assert len(ray_prefixed) < 60, "\n".join(ray_prefixed)  # the task logs, not a flood from every worker
    # The Ray workers' output reached the terminal, read by the flow process (no log monitor process).
    assert any("(train pid=" in line and "Task run 'train-" in line for line in ray_prefixed), out[-4000:]
    page = re.search(r"/runs/flow-run/([0-9a-f-]{36})", out)  # the run's page in the Prefect UI
    assert page, out[-3000:]
    assert (services["home"] / "mlflow.db").is_file() and (services["home"] / "runs").is_dir()
    # Every task run of that (uninterrupted) run reached the server.
    main_steps = _steps_run(services, page.group(1))
    main_tasks = _task_runs(services, main_steps["id"])
    assert sorted(t["name"].rsplit("-", 1)[0] for t in main_tasks) == [
        "download-dataset",
        "evaluate",
        "register",
        "train",
    ]
    assert {t["state_type"] for t in main_tasks} == {"COMPLETED"}
    train = next(t for t in main_tasks if t["name"].startswith("train-"))
    assert any("rank 0 report 1" in m and "val_accuracy" in m for m in _logs(services, task_run_id=[train["id"]]))

    # 2. The scheduled deployment, through a worker; only the data, size and lr are passed, no location.
    [deployment] = [d for d in _api(services, "/deployments/filter", {}) if d["name"] == DEPLOYMENT.split("/")[1]]
    assert deployment["enforce_parameter_schema"] is True
    assert (deployment.get("concurrency_options") or {}).get("collision_strategy") == "ENQUEUE"
    [schedule] = deployment["schedules"]
    assert schedule["schedule"]["cron"] == "0 3 * * 1" and schedule["schedule"]["timezone"] == "Europe/Berlin"
    params = {
        **SMALL,
        "limit": 1024,
        "mirrors": [FASHION_MNIST_MIRROR],
        "epochs": 3,
        "recipe": "tutorial",
        "lr": 0.0,
    }  # lr=0: the initial weights, worse than the champion
    flow_run_id = _start_deployment_run(services, params)
    run_folder = services["home"] / "runs" / f"{model_name}-{flow_run_id[:8]}"

    # The first attempt is SIGKILLed during epoch 2 of 3; the retry continues the same flow run.
    killed_during = _kill_during_epoch_2(services, flow_run_id, run_folder)
    assert killed_during == [0], f"the kill came after epoch 2 was committed: {killed_during}"
    _cli(services, "flow-run", "retry", flow_run_id)
    worker_log = _run_worker_once(services)
    top = _flow_run(services, flow_run_id)
    assert top["state_type"] == "COMPLETED", f"{top['state']['message']}\n{worker_log}"
    assert re.fullmatch(rf"{model_name}-\d{{4}}-\d\d-\d\d-\d{{4}}", top["name"]), top["name"]
    assert _metrics_epochs(run_folder) == [0, 1, 2]  # no epoch trained twice; epoch 2's lost part redone once

    steps = _steps_run(services, flow_run_id)
    # The retry may run in the same subflow run: the second attempt's train task run is the newest.
    tasks = _task_runs(services, steps["id"])
    retried_train = max((t for t in tasks if t["name"].startswith("train-")), key=lambda t: t["created"])
    train_logs = _logs(services, task_run_id=[retried_train["id"]])
    # trainlib's own warning reached the task run's log; training went on from the committed checkpoint.
    assert any("resuming it from" in m and "checkpoint_000001" in m for m in train_logs), train_logs
    assert any("resuming from" in m for m in train_logs), train_logs
    # Nothing was downloaded again: the main command's download filled the home's cache.
    downloads = [t["id"] for t in tasks if t["name"].startswith("download-dataset-")]
    assert any("4 file(s) from the cache" in m for m in _logs(services, task_run_id=downloads))
    # The champion was loaded and gave its registered labels for the probe images, so its accuracy recorded on
    # these test images was taken, not scored again (tests/model/test_promotion.py: when it is scored).
    evaluations = [t["id"] for t in tasks if t["name"].startswith("evaluate-")]
    assert any(
        "on the same images (recorded at its registration" in m for m in _logs(services, task_run_id=evaluations)
    ), _logs(services, task_run_id=evaluations)
    # Rank 0's progress reached the flow run's log (so the terminal and the UI) in more than one epoch.
    # Whether a line falls inside an epoch depends on the machine's speed (lines come every 10 s):
    # the unit test of ProgressMeter pins the in-epoch publication.
    progress = [m for m in _logs(services, flow_run_id=[steps["id"]]) if m.startswith("Training: epoch")]
    assert len({m.split(",")[0] for m in progress}) >= 2 and "images/s" in progress[-1], progress

    # One registry: the retried run registered once, judged against the first run's champion.
    client = _mlflow(services)
    assert sorted(str(v.version) for v in client.search_model_versions(f"name = '{model_name}'")) == ["1", "2"]
    champion = client.get_model_version_by_alias(model_name, "champion")
    challenger = client.get_model_version_by_alias(model_name, "challenger")
    assert (str(champion.version), str(challenger.version)) == ("1", "2")
    assert challenger.tags["previous_champion_version"] == "1"
    assert challenger.tags["promotion_decision"] == "kept_champion"
    assert float(challenger.tags["previous_champion_test_accuracy"]) == pytest.approx(
        float(champion.tags["test_accuracy"]), abs=1e-6
    )
    assert client.get_run(champion.run_id).info.experiment_id == client.get_run(challenger.run_id).info.experiment_id
    assert challenger.tags["test_data_md5"] == champion.tags["test_data_md5"]  # scored on the same images
    # The killed and the retried attempt are one MLflow run, with each epoch's validation once.
    retried = client.get_run(challenger.run_id)
    assert retried.data.tags["trainlib.resumed"] == "1"
    assert sorted(m.step for m in client.get_metric_history(challenger.run_id, "val_accuracy")) == [1, 2, 3]
    assert len(client.search_runs([retried.info.experiment_id], f"tags.`prefect.flow_run_id` = '{flow_run_id}'")) == 1
    # Lineage: the data set is the run's input, the usual source tags, one checkpoint copy (the best), the recipe.
    run = client.get_run(champion.run_id)
    [dataset_input] = run.inputs.dataset_inputs
    assert (
        dataset_input.dataset.name == "fashion-mnist" and champion.tags["dataset_md5"] == dataset_input.dataset.digest
    )
    assert run.data.tags["mlflow.source.name"] == "flows.pipeline:training-pipeline" and "mlflow.user" in run.data.tags
    if os.path.exists(os.path.join(REPO_ROOT, ".git")):
        assert len(run.data.tags["mlflow.source.git.commit"]) == 40
    assert len(client.list_artifacts(champion.run_id, "checkpoints")) == 1
    assert champion.tags["recipe"] == "tutorial"  # the recipe the run was given, recorded on the version

    # The artifacts a person reads exist; the events say what happened.
    artifacts = {}  # the latest of each key
    for artifact in _api(services, "/artifacts/filter", {"sort": "CREATED_DESC"}):
        artifacts.setdefault(artifact["key"], artifact)
    assert {
        f"evaluation-{model_name}",
        f"per-class-accuracy-{model_name}",
        f"model-registry-{model_name}",
        f"training-progress-{model_name}",
        "mlflow-run-fashion-mnist",
    } <= set(artifacts)
    assert artifacts[f"training-progress-{model_name}"]["data"] == pytest.approx(100.0)
    promoted = _api(services, "/events/filter", {"filter": {"event": {"name": ["trainlib.model.promoted"]}}})["events"]
    assert any(
        e["resource"]["prefect.resource.id"] == f"mlflow.model.{model_name}" and str(e["payload"]["version"]) == "1"
        for e in promoted
    ), promoted
    assert f"/runs/{challenger.run_id}" in artifacts["mlflow-run-fashion-mnist"]["data"]
    services["results"]["ui_run"] = (main_steps["id"], model_name, "fashion-mnist")  # four task runs, one each


def test_bad_deployment_parameters_are_refused_by_the_server(deployed):
    for params, words in [
        ({"epochs": 0}, ["epochs"]),
        ({"dataset": "cifar10"}, ["dataset", "fashion-mnist"]),
        ({"epoch": 2}, ["epoch"]),
        ({"num_workers": "two"}, ["num_workers"]),
    ]:
        out = _cli(deployed, "deployment", "run", DEPLOYMENT, "--params", json.dumps({"params": params}), check=False)
        assert "UUID" not in out, out  # no flow run was created
        for word in words:
            assert word in out, out


# -- alerts ----------------------------------------------------------------------------------------------


class _Receiver(http.server.ThreadingHTTPServer):
    """A local HTTP endpoint that keeps every JSON body posted to it."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.received = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.bodies.append(json.loads(body or b"{}"))
                receiver.received.set()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@needs_data
def test_failed_run_notifies_the_webhook_and_emits_training_failed(services, ray_session, tmp_path):
    from deployments.alerts import configure_alerts, save_webhook_block

    receiver = _Receiver()
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    try:
        with using_prefect_server(services["api_url"]):
            block_id = save_webhook_block(f"http://127.0.0.1:{receiver.server_port}/alerts", allow_private_urls=True)
            configure_alerts(block_id)
        started = time.monotonic()
        state = _run_flow_in_process(
            services,
            ray_session,
            **{**SMALL, "num_workers": 64},
            epochs=1,
            mirrors=[FASHION_MNIST_MIRROR],
            model_name="fmnist-alerts",
            storage_path=str(tmp_path / "runs"),
            data_cache_dir=str(tmp_path / "cache"),
        )
        assert state.is_failed()
        assert "can hold at most" in state.message or "ResourcesUnavailableError" in state.message, state.message
        assert time.monotonic() - started < 120
        assert receiver.received.wait(90), "no notification arrived"
        flow_run = _flow_run(services, str(state.state_details.flow_run_id))
        [body] = [b for b in receiver.bodies if flow_run["name"] in b.get("body", "")]
        assert "Failed" in body["subject"] and flow_run["name"] in body["subject"]
        assert "entered state Failed" in body["body"] and "can hold at most" in body["body"], body
        deadline = time.monotonic() + 60  # events travel from the task's process in the background
        while True:
            events = _api(
                services, "/events/filter", {"filter": {"event": {"name": ["trainlib.training.failed"]}}, "limit": 50}
            )["events"]
            failed = [
                e for e in events if e["resource"]["prefect.resource.id"].startswith("trainlib.run.fmnist-alerts-")
            ]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert failed and "can hold at most" in failed[0]["payload"]["message"]
    finally:
        receiver.shutdown()
        receiver.server_close()


# -- the Prefect UI ----------------------------------------------------------------------------------------


@pytest.mark.long  # reads the run of the long test above
@pytest.mark.skipif(_chromium() is None, reason="Chromium is not installed: apt-get install -y chromium")
def test_flow_run_page_shows_task_runs_and_artifacts(services):
    from playwright.sync_api import sync_playwright

    if "ui_run" not in services["results"]:
        pytest.skip("needs a pipeline run of an earlier test in this module")
    steps_id, model_name, experiment = services["results"]["ui_run"]
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=_chromium(),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
        )
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1000})
            page.goto(f"{services['ui_url']}/runs/flow-run/{steps_id}")
            page.get_by_text("Completed").first.wait_for(timeout=UI_TIMEOUT_MS)
            page.get_by_text("4 Task runs").first.wait_for(timeout=UI_TIMEOUT_MS)
            page.get_by_text("Task Runs", exact=True).first.click()  # the tabs under the run's graph
            for name in ("download-dataset-", "train-", "evaluate-", "register-"):
                page.get_by_text(re.compile(f"^{name}[0-9a-f]+$")).first.wait_for(timeout=UI_TIMEOUT_MS)
            # The README's picture is refreshed only on request: a test run leaves the checkout as it found it.
            shot_dir = (
                os.path.join(REPO_ROOT, "docs")
                if os.environ.get("TRAINLIB_REFRESH_DOC_SCREENSHOTS") == "1"
                else str(services["root"])
            )
            page.screenshot(path=os.path.join(shot_dir, "prefect_flow_run.png"), full_page=True)
            page.get_by_text("Artifacts", exact=True).first.click()
            for key in (
                f"evaluation-{model_name}",
                f"model-registry-{model_name}",
                f"training-progress-{model_name}",
                f"mlflow-run-{experiment}",
            ):
                page.get_by_text(key, exact=True).first.wait_for(timeout=UI_TIMEOUT_MS)
        finally:
            browser.close()


# -- bad input ---------------------------------------------------------------------------------------------


LAST_TASK_LOGS_SCRIPT = r"""
import sys
from prefect import flow, get_run_logger, task
from prefect.context import get_run_context
from flows.preflight import current_api_url
from flows.task_runner import local_task_runner, ray_worker_env

@task
def last_step(marker: str) -> None:
    from prefect.events import emit_event

    for i in range(50):  # events queued as the task ends, beside its state changes
        emit_event(event="trainlib.test.queued", resource={"prefect.resource.id": f"trainlib.test.{i}"})
    get_run_logger().info(marker)

@flow(task_runner=local_task_runner(worker_env=ray_worker_env(current_api_url())))
def one_step(marker: str) -> str:
    last_step.submit(marker).result()
    return str(get_run_context().flow_run.id)

print("FLOW_RUN", one_step(sys.argv[1]))
"""


def test_the_last_tasks_log_lines_reach_the_server_before_ray_stops(services, tmp_path):
    # A Ray worker sends its lines in batches (here every 60 s, so the batch never comes due); the task runner
    # stops Ray, and the worker with it, as the flow ends. The task sends its lines before it returns.
    script = tmp_path / "one_step.py"
    script.write_text(LAST_TASK_LOGS_SCRIPT)
    marker = f"last-line-{os.getpid()}-{time.time_ns()}"
    done = subprocess.run(
        [sys.executable, str(script), marker],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=dict(services["env"], PREFECT_LOGGING_TO_API_BATCH_INTERVAL="60"),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [flow_run_id] = re.findall(r"^FLOW_RUN (\S+)$", done.stdout, re.M)
    tasks = [t["id"] for t in _task_runs(services, flow_run_id)]
    assert marker in _logs(services, task_run_id=tasks), _logs(services, task_run_id=tasks)
    # Sending what the worker holds is the expected case, not worth a WARNING on the user's console.
    assert "Still processing items" not in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]


@pytest.mark.parametrize(
    "params, expected",
    [
        ({"dataset": "cifar10"}, ["dataset", "fashion-mnist"]),
        ({"epochs": 0}, ["epochs", "greater than 0"]),
        ({"num_workers": 0}, ["num_workers", "greater than or equal to 1"]),
        ({"epoch": 3}, ["unknown parameter 'epoch'", "did you mean 'epochs'"]),
    ],
)
def test_invalid_parameters_fail_before_any_task(services, ray_session, tmp_path, params, expected):
    from flows.pipeline import training_pipeline

    with using_prefect_server(services["api_url"]):  # a plain dict, as a deployment run passes it: Prefect validates it
        state = training_pipeline(params={"storage_path": str(tmp_path), **params}, return_state=True)
    assert state.is_failed()
    for word in expected:
        assert word in state.message, state.message
    run = _flow_run(services, str(state.state_details.flow_run_id))
    assert run["state_type"] == "FAILED"
    assert not _task_runs(services, run["id"])


@needs_data
def test_corrupt_mirror_file_names_file_and_both_checksums(services, ray_session, tmp_path):
    mirror = tmp_path / "mirror"
    shutil.copytree(FASHION_MNIST_MIRROR, mirror)
    corrupt = mirror / "train-labels-idx1-ubyte.gz"
    corrupt.write_bytes(gzip.compress(b"not the labels", mtime=0))
    actual = hashlib.md5(corrupt.read_bytes()).hexdigest()
    state = _run_flow_in_process(
        services,
        ray_session,
        mirrors=[str(mirror)],
        storage_path=str(tmp_path / "runs"),
        data_cache_dir=str(tmp_path / "cache"),
        **SMALL,
    )
    assert state.is_failed()
    for word in ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe", actual, "checksum mismatch"):
        assert word in state.message, state.message


def test_unreachable_mirrors_list_every_url_tried(services, ray_session, tmp_path):
    closed = f"http://127.0.0.1:{free_port()}/fashion-mnist/"
    missing = str(tmp_path / "no-such-folder")
    started = time.monotonic()
    state = _run_flow_in_process(
        services,
        ray_session,
        mirrors=[closed, missing],
        storage_path=str(tmp_path / "runs"),
        data_cache_dir=str(tmp_path / "cache"),
        **SMALL,
    )
    assert state.is_failed()
    assert closed.rstrip("/") in state.message and missing in state.message, state.message
    assert time.monotonic() - started < 60
