"""A rank that keeps reporting checkpoints after its peer finished leaves no pile of uncommitted folders."""

from __future__ import annotations

import os
import tempfile
import time

import pytest

import trainlib
from trainlib import DataParallelTrainer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def reports_on_after_peer_finished_train_func(config):
    """Rank 0 reports once and finishes; rank 1 waits until it has, then reports 10 more checkpoints."""
    rank = trainlib.get_context().get_world_rank()
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, f"shard_{rank}.bin"), "wb") as f:
            f.write(b"x" * 1000)
        trainlib.report({"step": 1}, checkpoint=trainlib.Checkpoint.from_directory(folder))
    if rank == 0:
        return
    time.sleep(2)  # rank 0's end reaches the driver first
    for step in range(2, 12):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "shard_1.bin"), "wb") as f:
                f.write(b"x" * 1000)
            trainlib.report({"step": step}, checkpoint=trainlib.Checkpoint.from_directory(folder))


def test_reports_after_a_peer_finished_leave_no_uncommitted_folders(ray_session, storage_path, caplog):
    with pytest.raises(trainlib.TrainingFailedError, match="different numbers of times"):
        DataParallelTrainer(
            reports_on_after_peer_finished_train_func,
            scaling_config=trainlib.ScalingConfig(num_workers=2),
            run_config=trainlib.RunConfig(name="straggler", storage_path=storage_path, verbose=False),
        ).fit()
    folders = sorted(f for f in os.listdir(os.path.join(storage_path, "straggler")) if f.startswith("checkpoint_"))
    assert folders == ["checkpoint_000001"], folders
    assert any("cannot be committed" in r.getMessage() for r in caplog.records), caplog.text
