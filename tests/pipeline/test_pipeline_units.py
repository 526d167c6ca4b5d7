"""Fast tests of the pipeline's plain functions: promotion rule, parameter schema, retry rule,
evaluation report and pictures, Ray worker environment, and the deployment spec in prefect.yaml."""

from __future__ import annotations

import os

import pytest
import torch
import yaml
from conftest import REPO_ROOT

from deployments import DEPLOYMENT_NAME, SCHEDULE_CRON, SCHEDULE_TIMEZONE, SCORE_DEPLOYMENT_NAME, WORK_POOL
from tasks.domain.evaluation import evaluate_model, report_from_confusion
from tasks.domain.mirror_fetch import DatasetDownloadError, is_transient_download_failure
from tasks.domain.network import build_model
from tasks.domain.plots import plot_confusion_matrix, plot_learning_curve
from tasks.domain.promotion import decide_promotion, parse_accuracy
from tasks.domain.training_loop import split_train_val


def test_no_champion_means_promotion():
    decision = decide_promotion(0.5, None)
    assert decision.promote and "no champion yet" in decision.reason
    assert decision.tags()["previous_champion_version"] == "none"


def test_better_accuracy_takes_champion_and_ties_do_not():
    assert decide_promotion(0.91, 0.90, "3").promote
    tie = decide_promotion(0.90, 0.90, "3")
    assert not tie.promote and "champion version 3" in tie.reason and "champion kept" in tie.reason
    worse = decide_promotion(0.10, 0.47, "1")
    assert not worse.promote
    assert worse.tags() == {
        "promotion_decision": "kept_champion",
        "promotion_reason": worse.reason,
        "previous_champion_version": "1",
        "previous_champion_test_accuracy": "0.470000",
        "promotion_margin": "-0.370000",
        "promotion_min_margin": "0.000000",
    }


def test_champion_without_recorded_accuracy_is_replaced():
    decision = decide_promotion(0.2, None, "7")
    assert decision.promote and "version 7 has no test accuracy" in decision.reason


@pytest.mark.parametrize("bad", [1.5, -0.1, float("nan"), "0.9", True])
def test_promotion_rejects_non_accuracies(bad):
    with pytest.raises(ValueError, match="challenger_accuracy"):
        decide_promotion(bad, 0.5)


def test_parse_accuracy():
    assert parse_accuracy("0.875000") == 0.875
    assert parse_accuracy(None) is None and parse_accuracy("n/a") is None and parse_accuracy("3") is None


def _flow_parameter_errors(**params):
    from prefect.exceptions import ParameterTypeError

    from flows.pipeline import training_pipeline

    try:
        training_pipeline.validate_parameters({"params": params})
    except ParameterTypeError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    "params, words",
    [
        ({"epochs": 0}, ["epochs", "greater than 0"]),
        ({"epochs": -3}, ["epochs"]),
        ({"num_workers": 0}, ["num_workers", "greater than or equal to 1"]),
        ({"dataset": "cifar10"}, ["dataset", "'fashion-mnist' or 'mnist'"]),
        ({"epoch": 2}, ["unknown parameter 'epoch'", "did you mean 'epochs'"]),
        ({"epochs": "many"}, ["epochs", "valid integer"]),
        ({"lr": -1.0}, ["lr"]),
        ({"batch_size": 0}, ["batch_size"]),
        ({"limit": 0}, ["limit"]),
        ({"model_name": "bad name/with slash"}, ["model_name"]),
    ],
)
def test_bad_flow_parameters_are_rejected_with_the_field_named(params, words):
    message = _flow_parameter_errors(**params)
    assert message is not None
    for word in words:
        assert word in message, message


def test_good_flow_parameters_pass():
    assert _flow_parameter_errors(epochs=2, num_workers=2, lr=0.0, limit=256, mirrors=["/data"]) is None


def test_deployment_parameter_schema_is_enforced_by_types():
    from prefect.utilities.callables import parameter_schema

    from flows.pipeline import training_pipeline

    schema = parameter_schema(training_pipeline.fn).model_dump()
    assert list(schema["properties"]) == ["params"]
    model = schema["definitions"]["PipelineParams"]
    assert model["additionalProperties"] is False
    props = model["properties"]
    assert props["epochs"]["exclusiveMinimum"] == 0
    assert props["num_workers"]["minimum"] == 1
    assert props["dataset"]["enum"] == ["fashion-mnist", "mnist"]


def test_only_network_failures_are_retried():
    transient = DatasetDownloadError(
        "x",
        attempts=[
            ("http://a/f", "ConnectionRefusedError: refused (after 3 attempt(s))"),
            ("http://b/f", "skipped, unreachable earlier in this call: timed out"),
        ],
    )
    mismatch = DatasetDownloadError("x", attempts=[("http://a/f", "checksum mismatch for f: expected md5 1, got 2")])
    mixed = DatasetDownloadError(
        "x",
        attempts=[
            ("http://a/f", "ConnectionRefusedError: refused (after 3 attempt(s))"),
            ("/data/f", "FileNotFoundError: no such file"),
        ],
    )
    assert is_transient_download_failure(transient)
    assert not is_transient_download_failure(mismatch)
    assert not is_transient_download_failure(mixed)
    assert not is_transient_download_failure(ValueError("Unknown data set 'x'"))


def test_report_from_confusion_matrix():
    report = report_from_confusion([[3, 1], [0, 0]], 0.5, ["a", "b"])
    assert report.accuracy == 0.75 and report.num_images == 4
    assert report.per_class_accuracy == {"a": 0.75, "b": 0.0}
    assert report.metrics() == {
        "test_accuracy": 0.75,
        "test_loss": 0.5,
        "test_accuracy_class_0": 0.75,
        "test_accuracy_class_1": 0.0,
    }
    assert "| 0 | a | 75.00% | 4 |" in report.markdown()


def test_evaluate_model_counts_and_pictures(tmp_path):
    torch.manual_seed(0)
    model = build_model()
    images = torch.randint(0, 256, (20, 28, 28), dtype=torch.uint8)
    labels = torch.arange(20) % 10
    report = evaluate_model(model, images, labels, [str(i) for i in range(10)], batch_size=7)
    assert report.num_images == 20 and sum(map(sum, report.confusion_matrix)) == 20
    assert all(sum(row) == 2 for row in report.confusion_matrix)
    assert 0.0 <= report.accuracy <= 1.0 and report.loss > 0
    for path in (
        plot_confusion_matrix(report, str(tmp_path / "cm.png")),
        plot_learning_curve(
            [
                {"epoch": 0, "loss": 2.0, "val_loss": 1.9, "val_accuracy": 0.3},
                {"epoch": 1, "loss": 1.0, "val_loss": 1.2, "val_accuracy": 0.6},
            ],
            str(tmp_path / "lc.png"),
        ),
    ):
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_evaluate_model_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="as many labels as images"):
        evaluate_model(
            build_model(),
            torch.zeros(3, 28, 28, dtype=torch.uint8),
            torch.zeros(2, dtype=torch.int64),
            [str(i) for i in range(10)],
        )


def test_split_is_deterministic_and_disjoint():
    train, val = split_train_val(100, 0.1, seed=3)
    again_train, again_val = split_train_val(100, 0.1, seed=3)
    assert torch.equal(train, again_train) and torch.equal(val, again_val)
    assert len(val) == 10 and not set(train.tolist()) & set(val.tolist())
    with pytest.raises(ValueError, match="val_fraction"):
        split_train_val(100, 1.0, seed=0)


def test_ray_workers_get_the_api_url_and_no_ephemeral_server_and_no_secret():
    from flows.task_runner import make_task_runner, ray_worker_env

    env = ray_worker_env("http://127.0.0.1:4200/api")
    assert env == {
        "PREFECT_API_URL": "http://127.0.0.1:4200/api",
        "PREFECT_SERVER_ALLOW_EPHEMERAL_MODE": "false",
        "PREFECT_LOGGING_EXTRA_LOGGERS": "trainlib",
    }
    runner = make_task_runner(None, "http://127.0.0.1:4200/api")
    assert runner.address == "local" and runner.worker_env == env and "runtime_env" not in runner.init_kwargs
    assert runner.duplicate().worker_env == env  # Prefect runs a flow on a duplicate of its task runner
    assert make_task_runner("ray://head:10001", "http://x/api").address == "ray://head:10001"


def test_prefect_yaml_deployment_spec():
    with open(os.path.join(REPO_ROOT, "prefect.yaml")) as f:
        spec = yaml.safe_load(f)
    deployments = {d["name"]: d for d in spec["deployments"]}
    deployment = deployments[DEPLOYMENT_NAME]
    assert deployment["entrypoint"] == "flows.pipeline:training_pipeline"
    assert deployment["enforce_parameter_schema"] is True
    assert deployment["concurrency_limit"]["limit"] == 1
    [schedule] = deployment["schedules"]
    assert (schedule["cron"], schedule["timezone"]) == (SCHEDULE_CRON, SCHEDULE_TIMEZONE)
    assert deployment["work_pool"]["name"] == WORK_POOL
    assert deployment["name"] == DEPLOYMENT_NAME
    scoring = deployments[SCORE_DEPLOYMENT_NAME]
    assert scoring["entrypoint"] == "flows.score:score_images" and "schedules" not in scoring
    assert scoring["work_pool"]["name"] == WORK_POOL and scoring["enforce_parameter_schema"] is True


def _main_command(tmp_path, *args):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "TRAINLIB_", "MLFLOW_"))}
    env.update(TRAINLIB_HOME=str(tmp_path / "home"), PYTHONPATH=REPO_ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "flows.main", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    return done.returncode, done.stdout + done.stderr


def test_main_command_refuses_an_unknown_option_before_starting_anything(tmp_path):
    code, out = _main_command(tmp_path, "--epoch", "3")
    assert code == 2
    assert "unknown option --epoch: did you mean --epochs?" in out and "--help" in out
    assert not (tmp_path / "home").exists()  # no server, no store, nothing started


def test_main_command_ends_without_pythons_final_collection_over_its_libraries(tmp_path):
    import subprocess
    import sys

    # Run as `python -m flows.main`; a hook registered before it runs after all of its exit hooks.
    probe = (
        "import atexit, gc, runpy, sys; "
        "atexit.register(lambda: print('FROZEN', gc.get_freeze_count() > 0, flush=True)); "
        "sys.argv = ['flows.main', '--epoch', '3']; runpy.run_module('flows.main', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TRAINLIB_HOME": str(tmp_path / "home")},
    )
    assert done.returncode == 2 and "FROZEN True" in done.stdout, done.stdout + done.stderr


def test_main_command_names_every_bad_option_and_what_it_allows(tmp_path):
    code, out = _main_command(tmp_path, "--epochs", "0", "--dataset", "cifar10", "--num-workers", "two", "--lr", "-1")
    assert code == 2, out
    assert "--epochs '0'" in out and "an integer > 0 and <= 1000" in out
    assert "--dataset 'cifar10'" in out and "one of 'fashion-mnist', 'mnist'" in out
    assert "--num-workers 'two'" in out and "valid integer" in out
    assert "--lr '-1'" in out
    assert "Traceback" not in out and not (tmp_path / "home").exists()


def test_cli_options_are_the_parameter_model():
    from flows.main import build_parser, parse_params
    from flows.params import PipelineParams

    options = {a.dest for a in build_parser()._actions if a.option_strings and a.dest != "help"}
    assert options == set(PipelineParams.model_fields) | {"home", "prefect_port"}
    params, _ = parse_params(
        ["--epochs", "2", "--mirrors", "/a", "--mirrors", "s3://b/c", "--no-use-gpu", "--num-to-keep", "none"]
    )
    assert params == PipelineParams(epochs=2, mirrors=["/a", "s3://b/c"], use_gpu=False, num_to_keep=None)
    assert parse_params([])[0] == PipelineParams()  # the defaults are the model's


def test_every_entry_point_resolves_the_same_home(tmp_path, monkeypatch):
    from flows.params import PipelineParams
    from flows.pipeline_run import resolve_run
    from tasks.domain.home import PipelineHome

    for name in ("TRAINLIB_STORAGE_PATH", "TRAINLIB_DATA_CACHE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAINLIB_HOME", str(tmp_path))
    home = PipelineHome.resolve()
    assert home == PipelineHome(
        root=str(tmp_path),
        storage_path=str(tmp_path / "runs"),
        data_cache=str(tmp_path / "datasets"),
        mlflow_tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
    )
    assert home.mlflow_artifacts == str(tmp_path / "mlartifacts") and home.prefect_home == str(tmp_path / "prefect")
    run = resolve_run(PipelineParams(), "0123456789abcdef", home)
    assert run.training.storage_path == home.storage_path and run.mlflow_tracking_uri == home.mlflow_tracking_uri
    assert run.training.run_name == "fashion-mnist-resnet18-01234567"  # stable for the flow run: retries resume
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    monkeypatch.setenv("TRAINLIB_STORAGE_PATH", "s3://bucket/runs")
    team = PipelineHome.resolve()
    assert (team.mlflow_tracking_uri, team.storage_path, team.mlflow_artifacts) == (
        "http://mlflow:5000",
        "s3://bucket/runs",
        None,
    )
    explicit = resolve_run(PipelineParams(storage_path="/data/runs", run_name="mine"), "x" * 36, team)
    assert explicit.training.storage_path == "/data/runs" and explicit.training.run_name == "mine"


def test_progress_meter_publishes_at_most_every_interval_and_the_last_step():
    from tasks.domain.progress import EpochProgress, ProgressMeter

    class Sink:
        def __init__(self):
            self.seen: list[EpochProgress] = []

        def publish(self, progress):
            self.seen.append(progress)

    now = [100.0]
    sink = Sink()
    meter = ProgressMeter(sink, epochs=3, steps=10, world_size=2, interval_s=2.0, clock=lambda: now[0])
    meter.start_epoch(1)
    for _ in range(10):
        now[0] += 0.5
        meter.step(32)
    assert [p.step for p in sink.seen] == [0, 4, 8, 10]  # start, every 2 s, and the epoch's last step
    last = sink.seen[-1]
    assert last.images_per_s == pytest.approx(10 * 32 * 2 / 5.0) and last.eta_s == 0
    assert last.run_fraction == pytest.approx(2 / 3)
    assert sink.seen[1].describe() == "epoch 2/3, step 4/10 (40%), 128 images/s, epoch ETA 0:03"

    class Broken:
        def publish(self, progress):
            raise ConnectionError("board gone")

    ProgressMeter(Broken(), epochs=1, steps=1, world_size=1).start_epoch(0)  # never raises into training


def test_stage_times_are_typed_and_name_every_step():
    import pickle
    import time

    from flows.summary import StageTimes, Stopwatch

    watches = []
    for _ in range(4):
        with Stopwatch() as watch:
            time.sleep(0.01)
        watches.append(watch.time)
    times = StageTimes(*watches)
    assert list(times.seconds()) == ["download", "train", "evaluate", "register"]
    assert all(0.005 < s < 60 for s in times.seconds().values())
    assert times.train.started_at <= times.train.ended_at <= times.evaluate.started_at
    assert pickle.loads(pickle.dumps(times)) == times  # the flow's result is stored by Prefect
