"""Storage errors are classified: a full disk, a refused permission, a missing bucket, a too-long name fail
at once with StorageError naming the path and the real cause; only network-ish errors are retried.
No temporary files are left behind, and a run whose end could not be recorded is recognisably stale.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
import uuid

import fsspec
import pytest
from fault_helpers import MotoS3
from fault_train_funcs import steps_train_func
from fsspec.implementations.local import LocalFileSystem

import trainlib
from trainlib import DataParallelTrainer
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.errors import StorageError

pytestmark = pytest.mark.timeout(180)


class FailingFileSystem(LocalFileSystem):
    """The local disk seen as a remote filesystem whose writes fail with ``errno`` (calls counted)."""

    protocol = "failing"
    root_marker = "/"

    def __init__(self, error_number: int, **kwargs):
        super().__init__(**kwargs)
        self.error_number = error_number
        self.calls = 0

    def _fail(self, path):
        self.calls += 1
        raise OSError(self.error_number, os.strerror(self.error_number), path)

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        self._fail(path)

    def put_file(self, lpath, rpath, **kwargs):
        self._fail(rpath)


@pytest.mark.parametrize(
    "error_number, cause",
    [
        (errno.ENOSPC, "No space left on device"),
        (errno.EACCES, "Permission denied"),
        (errno.EROFS, "Read-only file system"),
        (errno.EDQUOT, "Disk quota exceeded"),
    ],
)
def test_permanent_errors_fail_at_once_naming_path_and_cause(tmp_path, error_number, cause):
    fs = FailingFileSystem(error_number, skip_instance_cache=True)
    storage = RunStorage(fs, str(tmp_path), "run")
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        storage.write_json_atomic(storage.join("trainlib_run.json"), {"status": "RUNNING"})
    assert fs.calls == 1, "a permanent error must not be retried"
    assert time.monotonic() - started < 1.0
    text = str(info.value)
    assert cause in text and "trainlib_run.json" in text and "reachable" not in text, text


def test_network_errors_are_retried(tmp_path):
    fs = FailingFileSystem(errno.ECONNRESET, skip_instance_cache=True)
    storage = RunStorage(fs, str(tmp_path), "run")
    with pytest.raises(StorageError, match="after 5 attempts.*reachable"):
        storage.write_json_atomic(storage.join("trainlib_run.json"), {})
    assert fs.calls == 5


def test_too_long_name(tmp_path):
    with pytest.raises(ValueError, match="RunConfig.name.*300 characters"):
        trainlib.RunConfig(name="n" * 300)
    storage = RunStorage(fsspec.filesystem("file"), str(tmp_path), "run")
    with pytest.raises(StorageError, match="File name too long") as info:
        storage.write_json_atomic(storage.join("x" * 300, "a.json"), {})
    assert "reachable" not in str(info.value)
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


def test_missing_bucket_is_named():
    with MotoS3() as s3:
        storage = RunStorage(s3.fs(), "no-such-bucket-" + uuid.uuid4().hex[:6] + "/runs", "run")
        started = time.monotonic()
        with pytest.raises(StorageError) as info:
            storage.write_json_atomic(storage.join("trainlib_run.json"), {})
        assert time.monotonic() - started < 5
        text = str(info.value)
        assert "no-such-bucket-" in text and "does not exist" in text and "create" in text, text


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs (needs root: mount); skipped where mounting is not allowed."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); the injected ENOSPC test covers it")
    yield str(mount)
    subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.integration
def test_full_disk_fails_the_run_fast_and_keeps_what_was_committed(ray_session, tiny_disk):
    trainer = DataParallelTrainer(
        steps_train_func,
        train_loop_config={"steps": 50, "big_bytes": 200_000},
        run_config=trainlib.RunConfig(name="full", storage_path=tiny_disk, verbose=False),
    )
    started = time.monotonic()
    with pytest.raises(trainlib.TrainlibError) as info:
        trainer.fit()
    assert time.monotonic() - started < 60
    assert "No space left on device" in str(info.value) and "reachable" not in str(info.value), str(info.value)
    run = os.path.join(tiny_disk, "full")
    leftovers = [os.path.join(d, f) for d, _, files in os.walk(run) for f in files if ".tmp-" in f]
    assert leftovers == []
    result = trainlib.Result.from_path(run)
    # Either the FAILED state was written, or the record is recognisably stale (its driver is gone).
    assert result.error is not None
    assert result.checkpoint is not None  # the checkpoints committed before the disk filled are kept
    with result.checkpoint.as_directory() as folder:
        assert os.path.exists(os.path.join(folder, "model.pt"))
