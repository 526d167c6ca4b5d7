"""What the MLflow logger does with a record MLflow cannot take (trainlib.mlflow._records)."""

from __future__ import annotations

import pytest
from mlflow.exceptions import MlflowException

from trainlib.mlflow._records import is_rejected, send_record


def test_a_checkpoint_deleted_before_its_copy_is_rejected_not_spooled(tmp_path):
    """Retention may delete a checkpoint before the logger copies it. That record must be rejected (a warning, then
    the next record), not taken for an outage: a spooled record that can never be sent blocked every later one, and
    the MLflow run stayed RUNNING with one step of metrics."""
    record = {
        "run_id": "0" * 32,
        "kind": "artifacts",
        "source": str(tmp_path / "checkpoint_000001"),
        "artifact_path": "checkpoints/checkpoint_000001",
    }
    with pytest.raises(MlflowException) as info:
        send_record(None, record)  # fails before it reaches the client
    assert "no longer exists" in str(info.value)
    assert is_rejected(info.value), info.value.error_code


def test_an_unknown_record_kind_is_rejected():
    with pytest.raises(MlflowException) as info:
        send_record(None, {"run_id": "0" * 32, "kind": "tea"})
    assert is_rejected(info.value), info.value.error_code
