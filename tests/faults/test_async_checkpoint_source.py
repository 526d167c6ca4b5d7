"""An ASYNC checkpoint whose folder is gone before its upload: never committed empty, the run fails naming it."""

from __future__ import annotations

import os
import queue
import tempfile
import uuid

import fsspec
import pytest
from conftest import controller_on

import trainlib
from trainlib import DataParallelTrainer
from trainlib._internal.execution.session import WorkerSession
from trainlib._internal.execution.spec import AttemptSpec, WorkerInfo
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.errors import WorkerError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def deleted_folder_train_func(config):
    """A first checkpoint of many files keeps the uploader busy, so the folders of the next reports (each a
    TemporaryDirectory block, the misuse the docs warn about) are deleted before their upload starts."""
    busy = tempfile.mkdtemp()
    for i in range(300):
        with open(os.path.join(busy, f"part_{i}.bin"), "wb") as f:
            f.write(b"x" * 1000)
    mode = trainlib.CheckpointUploadMode.ASYNC
    trainlib.report({"step": 1}, checkpoint=trainlib.Checkpoint.from_directory(busy), checkpoint_upload_mode=mode)
    for step in (2, 3, 4):
        with tempfile.TemporaryDirectory() as folder:
            for name in ("model.pt", "optimizer.pt"):
                with open(os.path.join(folder, name), "w") as f:
                    f.write(f"step {step}")
            trainlib.report(
                {"step": step}, checkpoint=trainlib.Checkpoint.from_directory(folder), checkpoint_upload_mode=mode
            )


def missing_folder_train_func(config):
    """The folder is deleted between Checkpoint.from_directory and report()."""
    import shutil

    os.makedirs(config["folder"])
    checkpoint = trainlib.Checkpoint.from_directory(config["folder"])
    shutil.rmtree(config["folder"])
    trainlib.report({"step": 1}, checkpoint=checkpoint, checkpoint_upload_mode=trainlib.CheckpointUploadMode.ASYNC)


def test_an_async_checkpoint_deleted_before_its_upload_fails_the_run_and_is_never_committed(ray_session, tmp_path):
    storage_path = str(tmp_path / "runs")
    with pytest.raises(trainlib.TrainingFailedError) as info:
        DataParallelTrainer(
            deleted_folder_train_func,
            run_config=trainlib.RunConfig(name="gone", storage_path=storage_path, verbose=False),
        ).fit()
    cause = info.value.failures[0].cause
    assert "changed before it was copied" in cause and "of report 2" in cause and "missing" in cause, cause
    assert "mkdtemp" in cause, cause
    # Every committed checkpoint holds every file it was reported with; none holds only its marker.
    result = trainlib.Result.from_path(f"{storage_path}/gone")
    for checkpoint, _ in result.best_checkpoints:
        with checkpoint.as_directory() as folder:
            names = sorted(n for n in os.listdir(folder) if not n.startswith("."))
            assert len(names) == 300 or names == ["model.pt", "optimizer.pt"], (checkpoint.path, names)
    assert [c.path.rsplit("_", 1)[1] for c, _ in result.best_checkpoints] == ["000001"]


def test_a_checkpoint_folder_deleted_before_report_is_refused_by_report(ray_session, tmp_path):
    missing = str(tmp_path / "never_made")
    with pytest.raises(trainlib.TrainingFailedError) as info:
        DataParallelTrainer(
            missing_folder_train_func,
            train_loop_config={"folder": missing},
            run_config=trainlib.RunConfig(name="missing", storage_path=str(tmp_path / "runs"), verbose=False),
        ).fit()
    cause = info.value.failures[0].cause
    assert "FileNotFoundError" in cause and missing in cause and "does not exist" in cause, cause
    assert trainlib.Result.from_path(str(tmp_path / "runs" / "missing")).checkpoint is None


def test_the_driver_never_writes_the_marker_over_files_that_did_not_all_arrive(tmp_path):
    """A rank's upload is done, then one of its files vanishes from storage before the commit: the driver checks
    the stored files against the rank's manifest and fails the attempt, naming the checkpoint and the file."""
    storage = RunStorage(fsspec.filesystem("memory"), "/bucket/runs", f"arrive-{uuid.uuid4().hex[:8]}")
    outbox: queue.Queue = queue.Queue()
    session = WorkerSession(WorkerInfo(0, 1, 0, 1, 0), AttemptSpec(0, storage, None, 1), outbox)
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.pt").write_text("weights")
    session.report({"step": 1}, trainlib.Checkpoint.from_directory(str(folder)))
    assert session.wait_uploads(30)
    storage.fs.rm(f"{storage.checkpoint_path(1)}/model.pt")
    controller = controller_on(storage, world_size=1)
    with pytest.raises(WorkerError, match=r"report 1 .*is not committed.*'model\.pt'"):
        controller.commits.add({}, set(), 1, outbox.get())
    assert storage.committed_checkpoints() == []
