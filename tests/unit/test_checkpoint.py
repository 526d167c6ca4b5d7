"""Checkpoint.from_uri is the inverse of Checkpoint.uri, on local disk and on any fsspec filesystem."""

from __future__ import annotations

import os

import fsspec

import trainlib


def test_from_uri_round_trips_a_local_checkpoint(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"weights")
    checkpoint = trainlib.Checkpoint.from_directory(tmp_path)
    again = trainlib.Checkpoint.from_uri(checkpoint.uri)
    assert again == checkpoint and again.is_local
    with again.as_directory() as folder:
        assert open(os.path.join(folder, "model.pt"), "rb").read() == b"weights"


def test_from_uri_opens_a_remote_checkpoint_through_fsspec():
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/runs/r/checkpoint_000001/model.pt", b"remote weights")
    checkpoint = trainlib.Checkpoint.from_uri("memory://runs/r/checkpoint_000001")
    assert not checkpoint.is_local
    assert checkpoint.uri.startswith("memory://") and trainlib.Checkpoint.from_uri(checkpoint.uri) == checkpoint
    with checkpoint.as_directory() as folder:
        assert open(os.path.join(folder, "model.pt"), "rb").read() == b"remote weights"


def test_filesystem_is_the_pyarrow_one_ray_train_gives():
    import pickle

    import pyarrow.fs

    fs = fsspec.filesystem("memory")
    fs.pipe_file("/runs/r/checkpoint_000002/model.pt", b"w")
    remote = trainlib.Checkpoint("/runs/r/checkpoint_000002", fs)
    assert isinstance(remote.filesystem, pyarrow.fs.PyFileSystem)  # fsspec's, seen through pyarrow
    assert remote.filesystem.get_file_info("/runs/r/checkpoint_000002/model.pt").size == 1
    given = pyarrow.fs.LocalFileSystem()
    assert trainlib.Checkpoint("/tmp", given).filesystem is given
    assert isinstance(trainlib.Checkpoint("/tmp").filesystem, pyarrow.fs.LocalFileSystem)
    # A checkpoint pickled before (its fsspec filesystem under "filesystem") still loads and reads.
    old = trainlib.Checkpoint.__new__(trainlib.Checkpoint)
    old.__setstate__({"filesystem": fs, "path": "/runs/r/checkpoint_000002"})
    again = pickle.loads(pickle.dumps(old))
    assert again.uri == remote.uri and isinstance(again.filesystem, pyarrow.fs.FileSystem)
