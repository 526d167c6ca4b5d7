"""A tracking outage mid-run: training finishes, nothing is lost silently, and a replay completes the MLflow run.

Also the embedded default store (``sqlite:///<cwd>/mlflow.db`` with ``<cwd>/mlartifacts``).
"""

from __future__ import annotations

import json
import logging
import os
import time

import pytest
from mlflow_helpers import MlflowServer, train_linear

import trainlib
from trainlib.mlflow import MLflowLogger
from trainlib.torch import TorchTrainer

pytestmark = pytest.mark.integration


class StopServerAfter(trainlib.Callback):
    """Kills the tracking server when a given step is committed (placed before the MLflowLogger)."""

    def __init__(self, server: MlflowServer, step: int):
        self.server = server
        self.step = step

    def after_report(self, run, report):
        if report.step == self.step:
            self.server.stop()


@pytest.mark.long
def test_server_killed_mid_run_training_finishes_spools_warns_and_replays(ray_session, storage_path, tmp_path, caplog):
    from mlflow import MlflowClient

    server = MlflowServer(str(tmp_path / "server")).start()
    try:
        logger = MLflowLogger(tracking_uri=server.uri, experiment_name="outage")
        caplog.set_level(logging.INFO, logger="trainlib")
        started = time.monotonic()
        result = TorchTrainer(
            train_linear,
            train_loop_config={"steps": 5},
            scaling_config=trainlib.ScalingConfig(num_workers=2),
            run_config=trainlib.RunConfig(
                name="outage", storage_path=storage_path, callbacks=[StopServerAfter(server, 2), logger]
            ),
        ).fit()
        elapsed = time.monotonic() - started
        print(f"fit with the tracking server gone from step 2 took {elapsed:.1f} s")

        # Training finished, every checkpoint is committed in run storage.
        assert result.error is None and result.metrics["step_seen"] == 5
        stored = trainlib.Result.from_path(result.path)
        assert sorted(os.path.basename(c.path) for c, _ in stored.best_checkpoints) == [
            f"checkpoint_00000{i}" for i in range(1, 6)
        ]

        # The spool holds exactly what MLflow missed: metrics of steps 2-5, checkpoints 2-5, the end status.
        with open(logger.spool_path) as f:
            records = [json.loads(line) for line in f]
        assert sorted(r["step"] for r in records if r["kind"] == "metrics") == [2, 3, 4, 5]
        assert [r["artifact_path"] for r in records if r["kind"] == "artifacts"] == [
            f"checkpoints/checkpoint_00000{i}" for i in range(2, 6)
        ]
        assert [r["status"] for r in records if r["kind"] == "status"] == ["FINISHED"]
        assert {r["run_id"] for r in records} == {logger.run_id}

        # The user is told, in a WARNING, what was not logged and how to send it.
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert any("failed" in w and logger.spool_path in w for w in warnings), warnings
        final = [w for w in warnings if "is missing" in w]
        assert final, warnings
        assert "loss, step_seen at steps 2-5" in final[-1]
        assert "checkpoints/checkpoint_000005" in final[-1] and "the final status FINISHED" in final[-1]
        assert "replay_spool" in final[-1] and logger.spool_path in final[-1]

        # The server comes back (same port and database): the replay completes the MLflow run.
        server = MlflowServer(server.root, port=server.port).start()
        replay = MLflowLogger.replay_spool(logger.spool_path)
        assert (replay.sent, replay.remaining, replay.rejected) == (len(records), 0, ())
        assert not os.path.exists(logger.spool_path)
        client = MlflowClient(tracking_uri=server.uri)
        run = client.get_run(logger.run_id)
        assert run.info.status == "FINISHED"
        history = sorted(client.get_metric_history(logger.run_id, "loss"), key=lambda m: m.step)
        assert [m.step for m in history] == [1, 2, 3, 4, 5]
        assert [m.value for m in history] == pytest.approx(list(result.metrics_dataframe["loss"]))
        assert [a.path for a in client.list_artifacts(logger.run_id, "checkpoints")] == [
            f"checkpoints/checkpoint_00000{i}" for i in range(1, 6)
        ]
    finally:
        server.stop()


def test_the_embedded_default_store_is_sqlite_and_mlartifacts_in_the_working_directory(
    ray_session, storage_path, tmp_path, monkeypatch
):
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    logger = MLflowLogger(log_checkpoints="last")
    result = TorchTrainer(
        train_linear,
        train_loop_config={"steps": 3, "lr": 0.05},
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(name="embedded", storage_path=storage_path, callbacks=[logger]),
    ).fit()
    assert result.error is None
    assert os.path.isfile(tmp_path / "mlflow.db")
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainlib")
    assert experiment.artifact_location.removeprefix("file://") == str(tmp_path / "mlartifacts" / "trainlib")
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED" and run.data.params["lr"] == "0.05"
    assert [m.step for m in client.get_metric_history(logger.run_id, "loss")] == [1, 2, 3]
    # "last": only the final checkpoint is copied, into <cwd>/mlartifacts.
    assert [a.path for a in client.list_artifacts(logger.run_id, "checkpoints")] == ["checkpoints/checkpoint_000003"]
    assert os.path.isfile(
        tmp_path
        / "mlartifacts"
        / "trainlib"
        / logger.run_id
        / "artifacts"
        / "checkpoints"
        / "checkpoint_000003"
        / "model.pt"
    )
    assert run.data.tags["trainlib.last_checkpoint"] == result.checkpoint.uri


@pytest.mark.long
def test_resuming_the_run_replays_its_spool_automatically(ray_session, storage_path, tmp_path):
    from mlflow import MlflowClient

    server = MlflowServer(str(tmp_path / "server")).start()
    try:
        logger = MLflowLogger(tracking_uri=server.uri, experiment_name="outage")
        TorchTrainer(
            train_linear,
            train_loop_config={"steps": 3},
            scaling_config=trainlib.ScalingConfig(num_workers=2),
            run_config=trainlib.RunConfig(
                name="auto-replay", storage_path=storage_path, callbacks=[StopServerAfter(server, 3), logger]
            ),
        ).fit()
        assert os.path.exists(logger.spool_path)
        server = MlflowServer(server.root, port=server.port).start()

        resumer = MLflowLogger(tracking_uri=server.uri, experiment_name="outage")
        result = TorchTrainer.restore(
            os.path.join(storage_path, "auto-replay"), train_loop_config={"steps": 4}, callbacks=[resumer]
        ).fit()
        assert result.error is None and resumer.run_id == logger.run_id
        assert not os.path.exists(logger.spool_path)  # sent before the resumed run logged anything
        client = MlflowClient(tracking_uri=server.uri)
        assert [m.step for m in sorted(client.get_metric_history(logger.run_id, "loss"), key=lambda m: m.step)] == [
            1,
            2,
            3,
            4,
        ]
        assert client.get_run(logger.run_id).info.status == "FINISHED"
        assert [a.path for a in client.list_artifacts(logger.run_id, "checkpoints")] == [
            f"checkpoints/checkpoint_00000{i}" for i in range(1, 5)
        ]
    finally:
        server.stop()
