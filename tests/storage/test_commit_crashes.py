"""Run storage: a crash at every step of a checkpoint commit never yields a valid-looking checkpoint.

Local storage is crashed for real: a child process runs the upload and the commit
and dies (os._exit) at the k-th filesystem mutation, mid-copy where the mutation is
a copy. Object storage is modelled with fsspec's in-memory filesystem, interrupted
at the k-th PUT. After each crash, ``committed_checkpoints()``, ``Result.from_path``,
the resume path of the trainer (``get_checkpoint()`` is the controller's latest
checkpoint) and ``remove_uncommitted`` are checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid

import fsspec
import pytest

import trainlib
from trainlib._internal.execution.run import open_run
from trainlib._internal.storage.commits import COMMIT_MARKER
from trainlib._internal.storage.run_record import RUN_STATE_FILE, RunRecord, RunStatus
from trainlib._internal.storage.run_storage import RunStorage
from trainlib._internal.util import filesystem as filesystem_mod
from trainlib.errors import StorageError
from trainlib.torch import TorchTrainer

FILES = {"model.pt": 4000, "optim/state.pt": 2500, "meta.json": 300}


def train_func(config):  # never run: the trainer is only used for its resume path
    pass


def make_source(tmp_path, step):
    src = tmp_path / f"src_{step}_{uuid.uuid4().hex[:6]}"
    for rel, size in FILES.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(bytes([step % 256]) * size)
    return str(src)


def new_run(fs, root, name="run"):
    storage = RunStorage(fs, root, name)
    storage.write_json_atomic(
        storage.join(RUN_STATE_FILE), {"name": name, "status": "RUNNING", "checkpoint_config": {}}
    )
    return storage


def commit(storage, src, step):
    manifest = storage.upload_directory(src, storage.checkpoint_path(step))
    return storage.commit_checkpoint(step, {"loss": 1.0 / step}, manifest)


def assert_only_previous_is_valid(storage, previous_step=1, crashed_step=2):
    """Every reader sees the previous checkpoint as the latest; cleanup removes the crashed folder."""
    assert [c.step for c in storage.committed_checkpoints()] == [previous_step]
    result = trainlib.Result.from_path(storage.uri(), storage_filesystem=storage.fs if not storage.is_local else None)
    assert result.checkpoint is not None
    assert os.path.basename(result.checkpoint.path.rstrip("/")) == f"checkpoint_{previous_step:06d}"
    assert [os.path.basename(c.path.rstrip("/")) for c, _ in result.best_checkpoints] == [
        f"checkpoint_{previous_step:06d}"
    ]
    # The resume path: what the trainer would restart from (get_checkpoint() in the workers).
    trainer = TorchTrainer(
        train_func,
        run_config=trainlib.RunConfig(
            name=storage.name,
            storage_path=storage.uri(storage.root) if not storage.is_local else storage.root,
            storage_filesystem=None if storage.is_local else storage.fs,
            verbose=False,
        ),
    )
    opened = open_run(
        trainer.run_config,
        storage.name,
        restoring=False,
        train_fn=trainer._train_fn,
        train_loop_config=None,
        scaling_config=trainer.scaling_config,
    )
    assert [c.step for c in opened.committed] == [previous_step]
    # open_run removed the uncommitted folder.
    assert not storage.fs.exists(storage.checkpoint_path(crashed_step))
    assert storage.remove_uncommitted() == []


CHILD = textwrap.dedent("""
    import os, shutil, sys
    import fsspec
    from trainlib._internal.storage.run_storage import RunStorage

    root, src, crash_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    storage = RunStorage(fsspec.filesystem("file"), root, "run")
    ops = []
    real_copyfile, real_replace, real_fsync = shutil.copyfile, os.replace, os.fsync

    def tick(kind):
        ops.append(kind)
        return len(ops) - 1 == crash_at

    def copyfile(a, b, *args, **kw):
        if tick("copy"):
            with open(a, "rb") as f, open(b, "wb") as g:
                g.write(f.read()[: os.path.getsize(a) // 2])  # half-copied, then the process dies
            os._exit(17)
        return real_copyfile(a, b, *args, **kw)

    def replace(a, b):
        if tick("rename"):
            os._exit(17)
        return real_replace(a, b)

    def fsync(fd):
        if tick("marker-write"):
            os.ftruncate(fd, 7)  # a torn marker temp file
            os._exit(17)
        return real_fsync(fd)

    shutil.copyfile, os.replace, os.fsync = copyfile, replace, fsync
    manifest = storage.upload_directory(src, storage.checkpoint_path(2))
    storage.commit_checkpoint(2, {"loss": 0.5}, manifest)
    print("OPS", ",".join(ops))
""")

# 3 files x (copy, rename) + marker (write, rename) = 8 crash points; 8 means "no crash".
LOCAL_CRASH_POINTS = list(range(9))


@pytest.mark.parametrize("crash_at", LOCAL_CRASH_POINTS)
def test_local_commit_killed_at_every_step(tmp_path, crash_at):
    root = str(tmp_path / "runs")
    storage = new_run(fsspec.filesystem("file"), root)
    commit(storage, make_source(tmp_path, 1), 1)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, root, make_source(tmp_path, 2), str(crash_at)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if crash_at == LOCAL_CRASH_POINTS[-1]:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split()[-1] == "copy,rename,copy,rename,copy,rename,marker-write,rename"
        assert [c.step for c in storage.committed_checkpoints()] == [1, 2]
        result = trainlib.Result.from_path(storage.run_path)
        assert result.checkpoint.path.endswith("checkpoint_000002")
        with result.checkpoint.as_directory() as folder:
            for rel, size in FILES.items():
                assert os.path.getsize(os.path.join(folder, rel)) == size
        return
    assert proc.returncode == 17, proc.stderr
    assert os.path.isdir(storage.checkpoint_path(2))  # the crash left something behind
    assert_only_previous_is_valid(storage)


class _Crash(BaseException):
    """Stands in for the process dying: not an Exception, so no retry loop swallows it."""


@pytest.mark.parametrize("crash_at", range(5))
def test_object_store_commit_interrupted_at_every_put(tmp_path, crash_at):
    fs = fsspec.filesystem("memory")
    root = f"/bucket-{uuid.uuid4().hex[:8]}/runs"
    storage = new_run(fs, root)
    commit(storage, make_source(tmp_path, 1), 1)
    puts = []

    class CrashingMemoryFS(type(fs)):
        def put_file(self, lpath, rpath, **kwargs):
            puts.append(rpath)
            if len(puts) - 1 == crash_at:
                # A multipart upload that dies midway leaves no object; a naive store might
                # leave a short one: model the worse case.
                with open(lpath, "rb") as f:
                    super().pipe_file(rpath, f.read()[:10])
                raise _Crash()
            return super().put_file(lpath, rpath, **kwargs)

        def pipe_file(self, path, value, **kwargs):
            puts.append(path)
            if len(puts) - 1 == crash_at:
                raise _Crash()
            return super().pipe_file(path, value, **kwargs)

    crashing = RunStorage(CrashingMemoryFS(skip_instance_cache=True), root, "run")
    assert not crashing.is_local
    if crash_at == 4:  # after the last PUT: nothing crashes
        commit(crashing, make_source(tmp_path, 2), 2)
        assert [c.step for c in storage.committed_checkpoints()] == [1, 2]
        return
    with pytest.raises(_Crash):
        commit(crashing, make_source(tmp_path, 2), 2)
    assert_only_previous_is_valid(storage)


@pytest.fixture
def two_checkpoints(tmp_path):
    storage = new_run(fsspec.filesystem("file"), str(tmp_path / "runs"))
    commit(storage, make_source(tmp_path, 1), 1)
    commit(storage, make_source(tmp_path, 2), 2)
    return storage


def test_marker_present_but_a_file_truncated(two_checkpoints):
    path = os.path.join(two_checkpoints.checkpoint_path(2), "optim", "state.pt")
    with open(path, "r+b") as f:
        f.truncate(100)
    assert_only_previous_is_valid(two_checkpoints)


def test_marker_present_but_a_file_missing(two_checkpoints):
    os.remove(os.path.join(two_checkpoints.checkpoint_path(2), "model.pt"))
    assert_only_previous_is_valid(two_checkpoints)


def test_marker_unreadable(two_checkpoints, caplog):
    marker = os.path.join(two_checkpoints.checkpoint_path(2), COMMIT_MARKER)
    with open(marker, "w") as f:
        f.write('{"step": 2, "files": {"mod')
    assert_only_previous_is_valid(two_checkpoints)
    assert "commit marker is unreadable" in caplog.text


def test_all_files_present_but_no_marker(two_checkpoints):
    os.remove(os.path.join(two_checkpoints.checkpoint_path(2), COMMIT_MARKER))
    assert_only_previous_is_valid(two_checkpoints)


def test_delete_interrupted_after_the_marker(two_checkpoints, monkeypatch):
    """Retention deletes the marker first: a crash right after leaves an invalid folder, never a valid part."""
    real_rm = two_checkpoints.fs.rm
    calls = []

    def rm(path, recursive=False, **kw):
        calls.append(path)
        if len(calls) == 2:
            raise _Crash()
        return real_rm(path, recursive=recursive, **kw)

    monkeypatch.setattr(two_checkpoints.fs, "rm", rm)
    with pytest.raises(_Crash):
        two_checkpoints.delete_checkpoint(two_checkpoints.checkpoint_path(2))
    monkeypatch.undo()
    assert calls[0].endswith(COMMIT_MARKER)
    assert os.path.exists(os.path.join(two_checkpoints.checkpoint_path(2), "model.pt"))
    assert_only_previous_is_valid(two_checkpoints)


def test_a_copied_back_checkpoint_does_not_carry_its_old_marker(two_checkpoints, tmp_path):
    """Re-reporting a restored checkpoint folder: the old marker must not commit the new folder early."""
    src = two_checkpoints.checkpoint_path(1)
    assert os.path.exists(os.path.join(src, COMMIT_MARKER))
    manifest = two_checkpoints.upload_directory(src, two_checkpoints.checkpoint_path(3))
    assert COMMIT_MARKER not in manifest
    assert [c.step for c in two_checkpoints.committed_checkpoints()] == [1, 2]


def test_run_state_write_is_atomic(tmp_path, monkeypatch):
    storage = new_run(fsspec.filesystem("file"), str(tmp_path / "runs"))

    def broken_replace(a, b):
        raise _Crash()

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(_Crash):
        storage.write_json_atomic(storage.join(RUN_STATE_FILE), {"status": "FINISHED"})
    monkeypatch.undo()
    assert RunRecord.load(storage).status is RunStatus.RUNNING


def test_metrics_log_on_object_storage_is_rewritten_whole(tmp_path):
    fs = fsspec.filesystem("memory")
    storage = new_run(fs, f"/bucket-{uuid.uuid4().hex[:8]}/runs")
    rows = []
    for step in (1, 2, 3):
        rows.append({"step": step, "attempt": 0, "time": 0.0, "checkpoint": None, "metrics": {"x": step}})
        storage.append_metrics_row(rows[-1], rows)
    assert [r["step"] for r in storage.read_metrics_log()] == [1, 2, 3]
    assert json.loads(fs.cat_file(storage.join("metrics.jsonl")).decode().splitlines()[0])["step"] == 1


def test_resolve_filesystem_names_the_field_on_a_bad_url():
    with pytest.raises(StorageError, match="RunConfig.storage_path='nosuchproto://x'"):
        filesystem_mod.resolve_filesystem("nosuchproto://x")


def test_reads_during_an_outage_raise_a_storage_error_not_a_raw_one(tmp_path, fast_retries):
    """A transient error while verifying a checkpoint is neither "not committed" nor a raw client error."""
    fs = fsspec.filesystem("memory")
    root = f"/bucket-{uuid.uuid4().hex[:8]}/runs"
    storage = new_run(fs, root)
    commit(storage, make_source(tmp_path, 1), 1)

    class DownFS(type(fs)):
        def cat_file(self, path, *args, **kwargs):
            raise ConnectionError(f"could not connect to the endpoint for {path}")

    down = RunStorage(DownFS(skip_instance_cache=True), root, "run")
    with pytest.raises(StorageError, match="checkpoint_000001.*reachable"):
        down.committed_checkpoints()
    with pytest.raises(StorageError, match="metrics.jsonl.*reachable"):
        down.read_metrics_log()


def test_a_storage_url_with_query_parameters_is_opened_by_pyarrow_and_given_back_without_secrets():
    import pyarrow.fs

    from trainlib._internal.util.filesystem import as_pyarrow, resolve_filesystem, to_uri
    from trainlib.errors import StorageError

    url = "s3://bucket/runs?endpoint_override=http://127.0.0.1:9&region=eu-west-1"
    fs, path = resolve_filesystem(url)
    assert path == "bucket/runs" and isinstance(as_pyarrow(fs), pyarrow.fs.S3FileSystem)
    assert as_pyarrow(fs).region == "eu-west-1"
    assert to_uri(fs, "bucket/runs/run") == "s3://bucket/runs/run?endpoint_override=http://127.0.0.1:9&region=eu-west-1"
    with pytest.raises(StorageError) as info:  # pyarrow takes no credentials in the URL: refused, never echoed
        resolve_filesystem(url + "&secret_key=TOPSECRET")
    assert "TOPSECRET" not in str(info.value) and "secret_key" in str(info.value)
    with pytest.raises(StorageError, match="storage_options"):
        resolve_filesystem(url, storage_options={"anon": True})
