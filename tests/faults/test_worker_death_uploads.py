"""A worker that dies with staged-but-not-uploaded checkpoint files loses none of them.

On S3 a worker's report() stages the checkpoint on its node's disk and uploads in the background.
Here uploads take 2 s each and rank 1 is SIGKILLed right after its third report, with most of its
uploads still staged. Before the restart decides where to resume, the driver has the dead worker's
node finish them, so steps 1-3 are committed and the restart resumes at step 4.
"""

from __future__ import annotations

import glob
import json
import os
import queue
import subprocess
import tempfile
import uuid

import fsspec
import pytest
from conftest import REPO_ROOT, controller_on
from fault_helpers import PYTHON, MotoS3
from fault_train_funcs import sharded_train_func

import trainlib
from trainlib import DataParallelTrainer
from trainlib._internal.execution import staging
from trainlib._internal.execution.messages import CheckpointPlacement
from trainlib._internal.execution.report_checkpoint import ReportOptions
from trainlib._internal.execution.session import WorkerSession
from trainlib._internal.execution.spec import AttemptSpec, WorkerInfo
from trainlib._internal.storage.run_storage import RunStorage

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_dead_workers_staged_uploads_are_finished_before_the_restart(ray_session):
    # DataParallelTrainer: no process group holds rank 1 back until rank 0 has started, so rank 1 at times
    # reports and dies before rank 0's session starts (the case the next test makes deterministic).
    with MotoS3() as s3:
        fs = s3.fs()
        trainer = DataParallelTrainer(
            sharded_train_func,
            train_loop_config={"steps": 5, "die_after": 3, "upload_delay_s": 2.0},
            scaling_config=trainlib.ScalingConfig(num_workers=2),
            run_config=trainlib.RunConfig(
                name="staged",
                storage_path=f"s3://{s3.bucket}/runs",
                storage_options=s3.options(),
                failure_config=trainlib.FailureConfig(max_failures=1),
                verbose=False,
            ),
        )
        result = trainer.fit()
        df = result.metrics_dataframe
        first = df[df["attempt"] == 0]
        second = df[df["attempt"] == 1]
        assert list(first["step"]) == [1, 2, 3], df  # every step rank 1 reported was committed
        assert set(second["start"]) == {4} and list(second["step"]) == [4, 5], df
        # The death is recorded with the rank, its pid and where its exit status can be found.
        state = json.loads(fs.cat_file(f"{s3.bucket}/runs/staged/trainlib_run.json"))
        (failure,) = state["failures"]
        assert failure["rank"] == 1 and "died" in failure["cause"] and "dmesg" in failure["cause"], failure
        for step in (1, 2, 3):  # every checkpoint is kept; the dead rank's own files are in them
            path = f"{s3.bucket}/runs/staged/checkpoint_{step:06d}"
            assert fs.cat_file(f"{path}/shard_1.txt") == f"step{step}".encode()
            assert fs.cat_file(f"{path}/shard_0.txt") == f"step{step}".encode()


# Rank 1 of attempt 0: stages one report (into $DIR_NAME if set) whose upload never finishes, then is SIGKILLed.
_REPORT_AND_DIE = """
import os, queue, signal, tempfile, threading
import fsspec
import trainlib
from trainlib._internal.execution.session import WorkerSession, set_session
from trainlib._internal.execution.spec import AttemptSpec, WorkerInfo
from trainlib._internal.storage.run_storage import RunStorage

storage = RunStorage(fsspec.filesystem("memory"), "/bucket/runs", os.environ["RUN_NAME"])
session = WorkerSession(WorkerInfo(1, 2, 1, 2, 0), AttemptSpec(0, storage, None, 1), queue.Queue())
session.storage._upload_file = lambda local_file, dest: threading.Event().wait()  # stays staged
folder = tempfile.mkdtemp()
open(os.path.join(folder, "shard_1.txt"), "w").write("step1")
set_session(session)
trainlib.report({"step": 1}, checkpoint=trainlib.Checkpoint.from_directory(folder),
                checkpoint_dir_name=os.environ.get("DIR_NAME"))
print(os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_rank_that_starts_after_another_died_leaves_its_staged_reports_to_the_driver(tmp_path, monkeypatch):
    """Deterministic: rank 1 reports and dies before rank 0's session starts; the driver still finds its report."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # staging folders of this test only
    name = f"late-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": REPO_ROOT, "RUN_NAME": name}
    storage = RunStorage(fsspec.filesystem("memory"), "/bucket/runs", name)

    def report_and_die() -> int:
        dead = subprocess.run([PYTHON, "-c", _REPORT_AND_DIE], env=env, capture_output=True, text=True, timeout=60)
        assert dead.returncode == -9, dead.stdout + dead.stderr
        return int(dead.stdout.split()[0])

    pid = report_and_die()
    # Rank 0 of the same attempt starts now: its sweep must leave rank 1's folder to the driver.
    late = WorkerSession(WorkerInfo(0, 2, 0, 2, 0), AttemptSpec(0, storage, None, 1), queue.Queue())
    (message,) = staging.finish_staged_uploads(storage, 1, pid, 0)
    assert (message.step, message.metrics, message.manifest) == (1, {"step": 1}, {"shard_1.txt": 5})
    assert storage.fs.cat_file(f"{storage.checkpoint_path(1)}/shard_1.txt") == b"step1"
    late.finish()

    # A dead rank's folder that the driver did not recover is swept by the next attempt's workers.
    report_and_die()
    assert len(glob.glob(os.path.join(tmp_path, "trainlib_stage_rank1_*"))) == 1
    staging.make_staging_root(0, storage.run_path, 1)
    assert glob.glob(os.path.join(tmp_path, "trainlib_stage_rank1_*")) == []


def test_a_dead_ranks_staged_report_keeps_its_checkpoint_dir_name(tmp_path, monkeypatch):
    """Rank 1 reports into checkpoint_dir_name="my_ckpt_1" and dies with the upload staged: the driver uploads it
    into that folder, and step 1 commits one checkpoint there with both ranks' files."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # staging folders of this test only
    name = f"named-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": REPO_ROOT, "RUN_NAME": name, "DIR_NAME": "my_ckpt_1"}
    storage = RunStorage(fsspec.filesystem("memory"), "/bucket/runs", name)
    dead = subprocess.run([PYTHON, "-c", _REPORT_AND_DIE], env=env, capture_output=True, text=True, timeout=60)
    assert dead.returncode == -9, dead.stdout + dead.stderr

    # Rank 0 lives and reports the same step into the same folder.
    outbox: queue.Queue = queue.Queue()
    live = WorkerSession(WorkerInfo(0, 2, 0, 2, 0), AttemptSpec(0, storage, None, 1), outbox)
    folder = tmp_path / "rank0"
    folder.mkdir()
    (folder / "shard_0.txt").write_text("step1")
    live.report({"step": 1}, trainlib.Checkpoint.from_directory(str(folder)), ReportOptions(dir_name="my_ckpt_1"))
    live_message = outbox.get(timeout=30)
    live.finish()

    (recovered,) = staging.finish_staged_uploads(storage, 1, int(dead.stdout.split()[0]), 0)
    assert recovered.placement == live_message.placement == CheckpointPlacement("my_ckpt_1")
    assert storage.fs.cat_file(f"{storage.checkpoint_path(1, 'my_ckpt_1')}/shard_1.txt") == b"step1"
    assert not storage.fs.exists(storage.checkpoint_path(1))

    # The driver commits the live and the recovered report as one checkpoint, complete, in the named folder.
    controller = controller_on(storage)
    pending: dict = {}
    for message in (live_message, recovered):
        controller.commits.add(pending, set(), 2, message)
    (committed,) = storage.committed_checkpoints()  # verified: every file the marker lists is there
    assert (committed.step, committed.path) == (1, storage.checkpoint_path(1, "my_ckpt_1"))
    marker = storage.read_json(f"{committed.path}/.trainlib_commit.json")
    assert marker["files"] == {"shard_0.txt": 5, "shard_1.txt": 5}
