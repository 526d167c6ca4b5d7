"""MLflowLogger and log_model against a real `mlflow server` process (SQLite store, proxied local artifacts)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sqlite3
import time

import pytest
import torch
from mlflow_helpers import mlflow_server, train_linear  # noqa: F401 - mlflow_server is a fixture

import trainlib
from trainlib.mlflow import MLflowLogger, TrackingError, log_model
from trainlib.torch import TorchTrainer

pytestmark = pytest.mark.integration

SECRET = "AKIAIOSFODNN7EXAMPLE"
SECRET_2 = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
LONG = "x" * 7000


def _client(server):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=server.uri)


def _fit(storage_path, name, config, logger, **run_kwargs):
    return TorchTrainer(
        train_linear,
        train_loop_config=config,
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(name=name, storage_path=storage_path, callbacks=[logger], **run_kwargs),
    ).fit()


def _runs_of(client, experiment_name, trainlib_name):
    experiment = client.get_experiment_by_name(experiment_name)
    return client.search_runs([experiment.experiment_id], f"tags.`trainlib.run_name` = '{trainlib_name}'")


def _steps(client, run_id, key):
    return [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp)]


@pytest.fixture(scope="module")
def finished_run(ray_session, mlflow_server, tmp_path_factory):
    storage = str(tmp_path_factory.mktemp("runs"))
    logger = MLflowLogger(tracking_uri=mlflow_server.uri, experiment_name="tracking-tests", tags={"team": "ml"})
    config = {
        "steps": 3,
        "lr": 0.1,
        "optim": {"momentum": 0.9, "nesterov": False},
        "aws_secret_access_key": SECRET_2,
        "endpoint": f"note {SECRET}",
        "long_note": LONG,
    }
    result = _fit(storage, "finished", config, logger)
    return logger, result, storage


def test_a_two_worker_run_is_one_mlflow_run_with_params_metrics_checkpoints_tags(finished_run, mlflow_server):
    logger, result, storage = finished_run
    client = _client(mlflow_server)
    assert result.error is None
    runs = _runs_of(client, "tracking-tests", "finished")
    assert [r.info.run_id for r in runs] == [logger.run_id]  # one run, not one per rank
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"

    params = run.data.params
    assert params["lr"] == "0.1" and params["steps"] == "3"
    assert params["optim.momentum"] == "0.9" and params["optim.nesterov"] == "False"
    assert params["scaling_config.num_workers"] == "2"
    assert params["aws_secret_access_key"] == "[REDACTED]"
    assert SECRET not in params["endpoint"] and "[REDACTED]" in params["endpoint"]
    assert len(params["long_note"]) == 6000 and params["long_note"].endswith("...[truncated]")

    tags = run.data.tags
    assert tags["trainlib.run_name"] == "finished"
    assert tags["trainlib.storage_path"] == result.path
    assert tags["trainlib.world_size"] == "2"
    assert tags["trainlib.device_type"] == "cpu"
    assert tags["trainlib.torch_version"] == importlib.metadata.version("torch")
    assert tags["trainlib.version"] == trainlib.__version__
    assert tags["team"] == "ml"

    # Every report's metrics at its step, equal to what trainlib recorded.
    df = result.metrics_dataframe
    logged = _steps(client, logger.run_id, "loss")
    assert [s for s, _ in logged] == list(df["step"]) == [1, 2, 3]
    assert [v for _, v in logged] == pytest.approx(list(df["loss"]))
    assert [s for s, _ in _steps(client, logger.run_id, "step_seen")] == [1, 2, 3]

    artifacts = [a.path for a in client.list_artifacts(logger.run_id, "checkpoints")]
    assert artifacts == [f"checkpoints/checkpoint_00000{i}" for i in (1, 2, 3)]
    files = {os.path.basename(a.path) for a in client.list_artifacts(logger.run_id, "checkpoints/checkpoint_000003")}
    assert {"model.pt", "step.txt"} <= files

    # The run id is kept with the trainlib run, for restarts and resumes.
    with open(os.path.join(result.path, "trainlib_run.json")) as f:
        assert json.load(f)["callbacks"]["mlflow"]["run_id"] == logger.run_id


def test_secrets_reach_neither_mlflow_nor_the_run_folder_state(finished_run, mlflow_server):
    logger, result, _ = finished_run
    with open(mlflow_server.db, "rb") as f:
        db = f.read()
    assert SECRET.encode() not in db and SECRET_2.encode() not in db
    # Every file the server keeps for the run (artifacts included) is free of the secrets too.
    for folder, _, names in os.walk(mlflow_server.artifacts):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read()
            assert SECRET.encode() not in data and SECRET_2.encode() not in data, name


def test_log_model_registers_the_unwrapped_model_and_it_loads_back(finished_run, mlflow_server):
    import mlflow.pytorch

    logger, result, _ = finished_run
    ended = _client(mlflow_server).get_run(logger.run_id).info.end_time
    example = torch.randn(5, 4)
    info = log_model(
        result.checkpoint,
        torch.nn.Linear(4, 1),
        input_example=example,
        registered_model_name="trainlib-linear",
        tracking_uri=mlflow_server.uri,
    )
    # Logged into the training's own MLflow run, found through the checkpoint's run folder.
    assert info.run_id == logger.run_id
    assert int(info.registered_model_version) == 1
    assert info.signature is not None and tuple(info.signature.inputs.to_dict()[0]["tensor-spec"]["shape"]) == (-1, 4)

    with result.checkpoint.as_directory() as folder:
        state = torch.load(os.path.join(folder, "model.pt"), weights_only=True)
    assert all(k.startswith("module.") for k in state)  # saved from the DDP wrapper
    expected = torch.nn.Linear(4, 1)
    expected.load_state_dict({k.removeprefix("module."): v for k, v in state.items()})

    previous = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(mlflow_server.uri)
    try:
        loaded = mlflow.pytorch.load_model("models:/trainlib-linear/1")
    finally:
        mlflow.set_tracking_uri(previous)
    with torch.no_grad():
        assert torch.allclose(loaded(example), expected(example))
    # Logging the model did not reopen the finished training run, nor move its end.
    after = _client(mlflow_server).get_run(logger.run_id).info
    assert (after.status, after.end_time) == ("FINISHED", ended)


def test_log_model_names_the_missing_state_dict_file(finished_run):
    _, result, _ = finished_run
    with pytest.raises(FileNotFoundError, match="has no 'weights.pt'.*state_dict_file"):
        log_model(result.checkpoint, torch.nn.Linear(4, 1), state_dict_file="weights.pt")


def test_a_restart_after_a_worker_failure_continues_the_same_mlflow_run(ray_session, mlflow_server, storage_path):
    logger = MLflowLogger(tracking_uri=mlflow_server.uri, experiment_name="tracking-tests", log_checkpoints="uri")
    result = _fit(
        storage_path,
        "restarted",
        {"steps": 3, "fail_once_at": 3},
        logger,
        failure_config=trainlib.FailureConfig(max_failures=1),
    )
    assert result.error is None
    client = _client(mlflow_server)
    runs = _runs_of(client, "tracking-tests", "restarted")
    assert [r.info.run_id for r in runs] == [logger.run_id]
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.tags["trainlib.failures"] == "1"
    assert "injected one-time failure" in run.data.tags["trainlib.last_failure"]
    assert [s for s, _ in _steps(client, logger.run_id, "loss")] == [1, 2, 3]
    # "uri": the checkpoints stay in run storage; MLflow holds their URIs, not copies.
    assert run.data.tags["trainlib.checkpoint.checkpoint_000003"] == result.checkpoint.uri
    assert client.list_artifacts(logger.run_id, "checkpoints") == []


def test_a_failed_run_is_failed_and_its_resume_continues_the_same_run(ray_session, mlflow_server, storage_path):
    client = _client(mlflow_server)
    logger = MLflowLogger(tracking_uri=mlflow_server.uri, experiment_name="tracking-tests")
    with pytest.raises(trainlib.TrainingFailedError):
        _fit(storage_path, "resumed", {"steps": 3, "fail_always_at": 3}, logger)
    run = client.get_run(logger.run_id)
    assert run.info.status == "FAILED"
    assert "injected failure at step 3" in run.data.tags["trainlib.error"]
    first_id = logger.run_id
    # As if the driver had been killed between committing report 2 and sending it: MLflow lacks it.
    with sqlite3.connect(mlflow_server.db) as db:
        db.execute("DELETE FROM metrics WHERE run_uuid = ? AND step = 2", (first_id,))
    assert [s for s, _ in _steps(client, first_id, "loss")] == [1]

    # Resume the same trainlib run with a changed config: the same MLflow run continues, no param error.
    resumer = MLflowLogger(tracking_uri=mlflow_server.uri, experiment_name="tracking-tests")
    result = TorchTrainer.restore(
        os.path.join(storage_path, "resumed"), train_loop_config={"steps": 4}, callbacks=[resumer]
    ).fit()
    assert result.error is None and resumer.run_id == first_id
    assert [r.info.run_id for r in _runs_of(client, "tracking-tests", "resumed")] == [first_id]
    run = client.get_run(first_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["trainlib.resumed"] == "1"
    assert run.data.params["steps"] == "3"  # MLflow params are immutable: the first value stays
    # Report 2 came back from run storage, once; report 3 failed before it was committed.
    assert [s for s, _ in _steps(client, first_id, "loss")] == [1, 2, 3, 4]
    assert [a.path for a in client.list_artifacts(first_id, "checkpoints")] == [
        f"checkpoints/checkpoint_00000{i}" for i in (1, 2, 3, 4)
    ]


def test_an_unreachable_server_stops_the_run_before_any_worker_starts(ray_session, storage_path, tmp_path):
    from mlflow_helpers import free_port

    uri = f"http://127.0.0.1:{free_port()}"
    marker = tmp_path / "worker_started"
    started = time.monotonic()
    with pytest.raises(TrackingError) as caught:
        _fit(storage_path, "unreachable", {"steps": 2, "marker": str(marker)}, MLflowLogger(tracking_uri=uri))
    message = str(caught.value)
    assert uri in message and "mlflow server" in message and "MLFLOW_TRACKING_URI" in message
    assert time.monotonic() - started < 60
    assert not marker.exists()  # no worker ran
    run_dir = os.path.join(storage_path, "unreachable")
    assert not [n for n in os.listdir(run_dir) if n.startswith("checkpoint_") or n == "metrics.jsonl"]


def test_bad_logger_arguments_name_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"log_checkpoints='every'.*'all', 'best', 'last', 'uri'"):
        MLflowLogger(log_checkpoints="every")
    with pytest.raises(ValueError, match="experiment_name"):
        MLflowLogger(experiment_name=" ")
