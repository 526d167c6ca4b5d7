"""Retention as Ray Train's: CheckpointConfig(num_to_keep=2, score) keeps the two best, best_checkpoints lists
them in Ray's order; the latest is kept for resuming only while the run is unfinished. pyarrow filesystems."""

from __future__ import annotations

import os
import tempfile

import pytest

import trainlib
from trainlib import DataParallelTrainer

SCORES = [0.5, 0.9, 0.7, 0.8, 0.1]


def scored_train_func(config):
    for step, score in enumerate(SCORES):
        with tempfile.TemporaryDirectory() as folder:
            open(os.path.join(folder, "step.txt"), "w").write(str(step))
            trainlib.report({"acc": score, "step": step}, checkpoint=trainlib.Checkpoint.from_directory(folder))
    if config.get("fail_at_end"):
        raise RuntimeError("planned failure after the last report")


def _fit(storage_path, name, checkpoint_config, fail_at_end=False, **run_kwargs):
    # DataParallelTrainer: workers without torch (the suite's CPU budget); retention is the same for every trainer.
    return DataParallelTrainer(
        scored_train_func,
        train_loop_config={"fail_at_end": fail_at_end},
        scaling_config=trainlib.ScalingConfig(num_workers=1),
        run_config=trainlib.RunConfig(
            name=name, storage_path=storage_path, verbose=False, checkpoint_config=checkpoint_config, **run_kwargs
        ),
    ).fit()


def _folders(path):
    return sorted(f for f in os.listdir(path) if f.startswith("checkpoint_"))


BEST_TWO = trainlib.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc", checkpoint_score_order="max")


def test_a_finished_run_keeps_exactly_the_two_best(ray_session, storage_path):
    result = _fit(storage_path, "best-two", BEST_TWO)
    assert [m["acc"] for _, m in result.best_checkpoints] == [0.8, 0.9]  # Ray's order: best last
    assert _folders(result.path) == ["checkpoint_000002", "checkpoint_000004"]  # the disk budget is 2
    assert result.checkpoint.path.endswith("checkpoint_000004")  # the newest checkpoint kept
    assert type(result.filesystem).__name__ == "LocalFileSystem"  # pyarrow's, as in Ray Train
    again = trainlib.Result.from_path(result.path)
    assert [m["acc"] for _, m in again.best_checkpoints] == [0.8, 0.9]


def test_an_unfinished_run_also_keeps_the_latest_to_resume_but_not_as_a_best(ray_session, storage_path):
    with pytest.raises(trainlib.WorkerGroupError):
        _fit(storage_path, "best-two-failed", BEST_TWO, fail_at_end=True)
    path = os.path.join(storage_path, "best-two-failed")
    result = trainlib.Result.from_path(path)
    assert _folders(path) == ["checkpoint_000002", "checkpoint_000004", "checkpoint_000005"]
    assert result.checkpoint.path.endswith("checkpoint_000005")  # what a resume starts from
    assert [m["acc"] for _, m in result.best_checkpoints] == [0.8, 0.9]  # the latest is not one of the best


def test_without_a_score_best_checkpoints_are_in_report_order(ray_session, storage_path):
    result = _fit(storage_path, "latest-two", trainlib.CheckpointConfig(num_to_keep=2))
    assert [m["step"] for _, m in result.best_checkpoints] == [3, 4]
    all_kept = _fit(storage_path, "all-kept", trainlib.CheckpointConfig())
    assert [m["step"] for _, m in all_kept.best_checkpoints] == [0, 1, 2, 3, 4]


def test_a_pyarrow_filesystem_is_a_storage_filesystem(ray_session, tmp_path):
    import pyarrow.fs

    base = tmp_path / "bucket"
    base.mkdir()
    filesystem = pyarrow.fs.SubTreeFileSystem(str(base), pyarrow.fs.LocalFileSystem())  # a non-local pyarrow fs
    result = _fit("runs", "on-pyarrow", trainlib.CheckpointConfig(num_to_keep=1), storage_filesystem=filesystem)
    assert result.filesystem is filesystem
    assert result.metrics["step"] == 4
    assert (base / "runs" / "on-pyarrow" / "checkpoint_000005" / "step.txt").read_text() == "4"
    again = trainlib.Result.from_path("runs/on-pyarrow", storage_filesystem=filesystem)
    with again.checkpoint.as_directory() as folder:
        assert open(os.path.join(folder, "step.txt")).read() == "4"
    # pyarrow's local filesystem is the local disk.
    local = _fit(
        str(tmp_path / "local"),
        "on-pyarrow-local",
        trainlib.CheckpointConfig(num_to_keep=1),
        storage_filesystem=pyarrow.fs.LocalFileSystem(),
    )
    assert local.checkpoint.path == str(tmp_path / "local" / "on-pyarrow-local" / "checkpoint_000005")
    # Ray Train's Result.path and filesystem on local disk: the folder's path and a pyarrow LocalFileSystem.
    assert local.path == str(tmp_path / "local" / "on-pyarrow-local")
    assert isinstance(local.checkpoint.filesystem, pyarrow.fs.LocalFileSystem)
    assert local.filesystem.get_file_info(f"{local.checkpoint.path}/step.txt").size == 1
