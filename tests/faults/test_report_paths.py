"""The path from report() to a committed checkpoint when ranks die, retention runs and folders are reused.

No Ray, no cluster: real WorkerSessions on fsspec's memory filesystem, the staging recovery that the driver
runs on a dead rank's node (finish_staged_uploads), and the Controller's own commit path (~1 s in all).
"""

from __future__ import annotations

import os
import queue
import tempfile
import uuid

import fsspec
import pytest
from conftest import controller_on

import trainlib
from trainlib._internal.execution import staging
from trainlib._internal.execution.messages import ReportMessage
from trainlib._internal.execution.report_checkpoint import ReportOptions
from trainlib._internal.execution.session import WorkerSession
from trainlib._internal.execution.spec import AttemptSpec, WorkerInfo
from trainlib._internal.storage.commits import COMMIT_MARKER
from trainlib._internal.storage.run_storage import RunStorage

pytestmark = [pytest.mark.timeout(60)]


@pytest.fixture
def storage(tmp_path, monkeypatch) -> RunStorage:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # staging folders of this test only
    return RunStorage(fsspec.filesystem("memory"), "/bucket/runs", f"paths-{uuid.uuid4().hex[:8]}")


def _session(storage: RunStorage, rank: int, world_size: int, outbox: queue.Queue) -> WorkerSession:
    return WorkerSession(WorkerInfo(rank, world_size, rank, world_size, 0), AttemptSpec(0, storage, None, 1), outbox)


def _report(session: WorkerSession, tmp_path, step: int, dir_name: str | None = None) -> None:
    folder = tmp_path / f"attempt{session.attempt.attempt}_rank{session.info.world_rank}_step{step}"
    folder.mkdir()
    (folder / f"shard_{session.info.world_rank}.txt").write_text(f"step{step}")
    session.report({"step": step}, trainlib.Checkpoint.from_directory(str(folder)), ReportOptions(dir_name=dir_name))


def test_a_dead_ranks_recovery_never_commits_again_a_step_that_retention_deleted(storage, tmp_path):
    """Both ranks of a node die (OOM) after steps 1-3 were committed, num_to_keep=1 having deleted 1 and 2. Their
    step records outlive the uploads, so the recovery sends steps 1-3 again: steps 1 and 2 must not be committed a
    second time (a marker in a deleted folder, duplicate metrics rows and callbacks)."""
    outboxes = [queue.Queue(), queue.Queue()]
    sessions = [_session(storage, rank, 2, outboxes[rank]) for rank in range(2)]
    controller = controller_on(storage, checkpoint_config=trainlib.CheckpointConfig(num_to_keep=1))
    pending: dict = {}
    committed_steps: set = set()
    for step in (1, 2, 3):
        for session in sessions:
            _report(session, tmp_path, step)
    for session in sessions:
        assert session.wait_uploads(30)
    for outbox in outboxes:
        while not outbox.empty():
            controller.commits.add(pending, committed_steps, 2, outbox.get())
    assert [c.step for c in controller.commits.committed] == [3]

    # Both processes die now; the driver recovers each rank's staging folder on the node (wait(), then flush()).
    recovered = [m for rank in range(2) for m in staging.finish_staged_uploads(storage, rank, os.getpid(), 0)]
    assert sorted(m.step for m in recovered) == [1, 1, 2, 2, 3, 3]  # the records were kept after each upload
    for message in recovered:
        controller.commits.add(pending, committed_steps, 2, message)

    assert [c.step for c in controller.commits.committed] == [3]
    assert [row["step"] for row in controller.commits.metrics_rows] == [1, 2, 3]
    assert [row["step"] for row in storage.read_metrics_log()] == [1, 2, 3]
    assert not storage.fs.exists(f"{storage.checkpoint_path(1)}/{COMMIT_MARKER}")
    assert [c.step for c in storage.committed_checkpoints()] == [3]


def test_a_reused_checkpoint_dir_name_is_refused_before_it_overwrites_the_committed_checkpoint(storage, tmp_path):
    """Step 1 is committed in "latest"; step 2 names "latest" too. Copying into it would overwrite the files of the
    latest committed checkpoint under its marker (a crash mid-copy leaves step 1's marker over step 2's files, and
    equal sizes verify): report() refuses the name and the committed checkpoint stays whole."""
    outbox: queue.Queue = queue.Queue()
    session = _session(storage, 0, 1, outbox)
    controller = controller_on(storage, world_size=1)
    _report(session, tmp_path, 1, dir_name="latest")
    with pytest.raises(ValueError, match="latest"):  # at once, whether or not the driver committed step 1 yet
        _report(session, tmp_path, 2, dir_name="latest")
    controller.commits.add({}, set(), 1, outbox.get(timeout=30))
    assert session.wait_uploads(30)
    assert outbox.empty()
    # A later attempt (a fresh session) knows the name by the committed checkpoint's marker.
    later = WorkerSession(WorkerInfo(0, 1, 0, 1, 0), AttemptSpec(1, storage, None, 2), outbox)
    with pytest.raises(ValueError, match="latest"):
        _report(later, tmp_path, 2, dir_name="latest")
    _report(later, tmp_path, 3, dir_name="latest_3")
    assert outbox.get(timeout=30).placement.dir_name == "latest_3"
    assert storage.fs.cat_file(f"{storage.checkpoint_path(1, 'latest')}/shard_0.txt") == b"step1"
    (committed,) = storage.committed_checkpoints()
    assert (committed.step, committed.path) == (1, storage.checkpoint_path(1, "latest"))


def test_retention_never_deletes_the_folder_that_a_later_step_was_committed_into(storage):
    """NO_UPLOAD (or an upload function) puts step 2 in place into "latest", the folder of committed step 1: the
    commit replaces step 1's marker, so step 1 is gone, and num_to_keep=1 must not delete "latest" as step 1's."""
    controller = controller_on(storage, world_size=1, checkpoint_config=trainlib.CheckpointConfig(num_to_keep=1))
    path = storage.checkpoint_path(1, "latest")
    from trainlib._internal.execution.messages import CheckpointPlacement

    for step in (1, 2):
        storage.fs.pipe_file(f"{path}/model.txt", f"step{step}".encode())
        controller.commits.add(
            {},
            set(),
            1,
            ReportMessage(
                rank=0,
                step=step,
                metrics={"step": step},
                manifest={},
                reported_at=float(step),
                placement=CheckpointPlacement("latest", in_place=True),
            ),
        )
    assert [(c.step, c.path) for c in controller.commits.committed] == [(2, path)]
    (committed,) = storage.committed_checkpoints()
    assert (committed.step, committed.path) == (2, path)
    assert storage.fs.cat_file(f"{path}/model.txt") == b"step2"
