"""The run lease on its own, on local disk and on S3 (moto server): one owner, stale takeover, loss. No Ray."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time

import fsspec
import pytest
from fault_helpers import MotoS3

from trainlib._internal.storage.lease import RunLease, read_lease
from trainlib._internal.storage.lease_record import LeaseRecord, lease_file_name
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.errors import RunExistsError, RunInUseError

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def s3():
    with MotoS3() as server:
        yield server


@pytest.fixture(params=["local", "s3"])
def storage(request, tmp_path):
    if request.param == "local":
        return RunStorage(fsspec.filesystem("file"), str(tmp_path), "run")
    s3 = request.getfixturevalue("s3")
    return RunStorage(s3.fs(), f"{s3.bucket}/{request.node.name.replace('[', '_').replace(']', '')}", "run")


def test_second_owner_is_refused_with_the_owner_named(storage):
    first = RunLease(storage)
    record = first.acquire()
    try:
        with pytest.raises(RunInUseError) as info:
            RunLease(storage).acquire()
        text = str(info.value)
        assert f"pid {os.getpid()}" in text and f"host {record.host}" in text and "started " in text
        assert "RunConfig.name" in text and "resume" in text
        assert isinstance(info.value, RunExistsError)
    finally:
        first.release()
    # Released: the next driver takes the run at once, in the next generation.
    second = RunLease(storage)
    assert second.acquire().generation == record.generation + 1
    assert second.previous is not None and second.previous.released_at is not None
    second.release()


def test_expired_heartbeat_is_taken_over_and_the_old_owner_learns_it(storage):
    old = RunLease(storage)
    old.acquire()
    old._stop.set()  # a stalled driver: no more heartbeats
    # Seen from another host: its heartbeat is older than the TTL.
    stale = dataclasses.replace(old.record, host="elsewhere", heartbeat_at=time.time() - old.record.ttl_s - 1)
    old._write_own(old._path(stale.generation), stale.to_bytes())
    new = RunLease(storage)
    assert new.acquire().generation == stale.generation + 1
    assert "no heartbeat" in new.previous.stale_reason()
    old.heartbeat()
    assert old.lost and "took the run over" in old.lost
    with pytest.raises(RunInUseError, match="no longer owns"):
        old.check()
    # The new owner cleaned the older generation.
    assert not storage.fs.exists(old._path(stale.generation))
    new.release()


def test_dead_owner_process_is_taken_over_at_once(storage):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = dataclasses.replace(
            LeaseRecord.mine(1),
            pid=child.pid,
            pid_start=int(open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[19]),
        )
        RunLease(storage)._create(f"{storage.run_path}/{lease_file_name(1)}", record.to_bytes())
        with pytest.raises(RunInUseError, match=f"pid {child.pid}"):
            RunLease(storage).acquire()  # alive: refused
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    lease = RunLease(storage)
    assert lease.acquire().generation == 2  # gone: taken over without waiting for the TTL
    assert "is gone" in lease.previous.stale_reason()
    assert read_lease(storage).owner_id == lease.record.owner_id
    lease.release()


def test_racing_contenders_get_one_owner(storage):
    import concurrent.futures

    def contend(_):
        lease = RunLease(storage)
        try:
            lease.acquire()
            return lease
        except RunInUseError:
            return None

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        winners = [w for w in pool.map(contend, range(8)) if w is not None]
    assert len(winners) == 1
    winners[0].release()


def test_a_lease_being_created_in_this_process_is_not_taken_as_ended(storage, monkeypatch):
    """Two fits in one process: the second reads the first's lease right after its file is created."""
    import threading

    created, checked = threading.Event(), threading.Event()
    real_create = RunLease._create

    def create_then_pause(self, path, data):
        won = real_create(self, path, data)
        if threading.current_thread().name == "first":
            created.set()
            checked.wait(30)
        return won

    monkeypatch.setattr(RunLease, "_create", create_then_pause)
    first = RunLease(storage)
    thread = threading.Thread(target=first.acquire, name="first")
    thread.start()
    assert created.wait(30)
    try:
        with pytest.raises(RunInUseError, match="being trained by another driver"):
            RunLease(storage).acquire()
    finally:
        checked.set()
        thread.join(30)
    assert first.record is not None and first.record.generation == 1
    first.release()


def test_a_generation_removed_while_read_is_followed_to_the_newer_one(storage, monkeypatch):
    """A contender that listed generation 1 just before the new owner removed it must not recreate it."""
    owner = RunLease(storage)
    owner.acquire()
    owner.release()
    newer = RunLease(storage)
    newer.acquire()  # generation 2; generation 1 removed
    real_generations = RunLease._generations
    calls = []

    def first_listing_is_stale(self):
        calls.append(1)
        return [1] if len(calls) == 1 else real_generations(self)

    monkeypatch.setattr(RunLease, "_generations", first_listing_is_stale)
    with pytest.raises(RunInUseError, match="being trained by another driver"):
        RunLease(storage).acquire()
    monkeypatch.setattr(RunLease, "_generations", real_generations)
    assert not storage.fs.exists(owner._path(1))  # not recreated by the contender
    newer.release()


def test_a_create_that_fails_leaves_nothing_held_in_this_process(storage, monkeypatch):
    from trainlib._internal.storage import lease as lease_module

    def storage_down(self, path, data):
        raise OSError("storage is down")

    held_before = set(lease_module._HELD_HERE)
    monkeypatch.setattr(RunLease, "_create", storage_down)
    with pytest.raises(OSError, match="storage is down"):
        RunLease(storage).acquire()
    assert lease_module._HELD_HERE == held_before
