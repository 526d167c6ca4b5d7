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
