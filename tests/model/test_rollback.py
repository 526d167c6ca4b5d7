"""Rollback on a real MLflow registry: `python -m flows.rollback` moves `champion` back, records who and why, and
the next run's challenger is compared with the restored champion."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT
from model_helpers import evaluate_and_register, needs_data, tiny_trained_network

pytestmark = [pytest.mark.integration, needs_data]

MODEL_NAME = "rollback-test"


def _rollback(uri: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "TRAINLIB_"))}
    return subprocess.run(
        [sys.executable, "-m", "flows.rollback", "--tracking-uri", uri, "--model", MODEL_NAME, *args],
        cwd=REPO_ROOT,
        env={**env, "PYTHONPATH": REPO_ROOT},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.timeout(600)
def test_rollback_restores_the_champion_records_who_and_why_and_the_next_run_compares_with_it(
    tmp_path, monkeypatch, capsys
):
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    _, _, first = evaluate_and_register(tmp_path, uri, MODEL_NAME, tiny_trained_network(steps=4), "first", 0.0)
    _, _, second = evaluate_and_register(tmp_path, uri, MODEL_NAME, tiny_trained_network(steps=16), "second", 0.0)
    assert (first.version, second.version) == ("1", "2") and second.decision.promote

    # Bad input: one line naming the option, the value and the fix; the alias untouched (the command's main,
    # in this process: a subprocess each costs MLflow's import).
    from flows.rollback import main

    for args, words in [
        (["--to-version", "7", "--reason", "x"], ["--to-version '7'", "versions: 1, 2"]),
        (["--to-version", "2", "--reason", "x"], ["champion of rollback-test already"]),
        (["--to-version", "1", "--reason", " "], ["--reason is empty"]),
    ]:
        assert main(["--tracking-uri", uri, "--model", MODEL_NAME, *args]) == 2
        err = capsys.readouterr().err
        assert all(word in err for word in words), err
    assert str(client.get_model_version_by_alias(MODEL_NAME, "champion").version) == "2"

    done = _rollback(uri, "--to-version", "1", "--reason", "class Shirt collapsed in production", "--by", "ana")
    assert done.returncode == 0, done.stderr
    assert "version 2 -> 1 by ana at" in done.stdout and "class Shirt collapsed in production" in done.stdout
    assert str(client.get_model_version_by_alias(MODEL_NAME, "champion").version) == "1"
    restored = client.get_model_version(MODEL_NAME, "1").tags
    assert restored["rollback.restored"].startswith("champion of rollback-test: version 2 -> 1 by ana at ")
    assert restored["rollback.replaced_version"] == "2"
    assert client.get_model_version(MODEL_NAME, "2").tags["rollback.demoted"] == restored["rollback.restored"]
    [history] = [v for k, v in client.get_registered_model(MODEL_NAME).tags.items() if k.startswith("rollback.")]
    assert history == restored["rollback.restored"]

    # The next run scores the restored champion (version 1), not the one rolled back from.
    network = tiny_trained_network(steps=8, seed=1)
    _, champion, third = evaluate_and_register(tmp_path, uri, MODEL_NAME, network, "third", 0.0)
    assert champion.version == "1" and third.decision.champion_version == "1"
    assert client.get_model_version(MODEL_NAME, third.version).tags["previous_champion_version"] == "1"
