"""The run lease: one owner (one driver) per run at a time, recorded in run storage. Driver only.

A run folder holds lease files ``trainlib_lease_<generation>.json``; the highest
generation is the current one. To own the run, a driver creates generation N+1
with a *conditional create* that only one contender can win:

- local disk and NFS: the record is written to a private temporary file, then
  ``os.link``-ed to the lease name; ``link`` fails when the name exists, atomically,
  also on NFS (the classic NFS-safe lock);
- S3: ``PUT`` with ``If-None-Match: *`` (s3fs ``mode="create"``), refused when the
  object exists;
- any other fsspec filesystem: ``open(path, "xb")`` where the filesystem supports it,
  else write-then-read-back (best effort; documented in docs/faults.md).

A driver may create N+1 only when generation N is free: released by its owner, or
stale: its heartbeat is older than its TTL, or its owner process is gone (same
host and boot, pid dead or reused). Only the owner ever rewrites its own
generation (heartbeat every ``LEASE_HEARTBEAT_S``); a new owner writes a new
generation, so an owner that was stalled and declared stale learns at its next
heartbeat that a higher generation exists, and stops (:attr:`RunLease.lost`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import posixpath
import socket
import threading
import time
import uuid
from typing import Any

from trainlib._internal import tunables
from trainlib._internal.storage.lease_record import (
    LEASE_PREFIX,
    LeaseRecord,
    lease_file_name,
)
from trainlib._internal.util.atomic import atomic_write
from trainlib.errors import RunInUseError

logger = logging.getLogger("trainlib")

# Owner ids of the leases this process holds now. A lease recorded for this very process but not
# held any more (its release could not be written, e.g. storage was down as the run failed) is
# ended: the next fit() in the same process takes the run over instead of waiting for the TTL.
_HELD_HERE: set[str] = set()


class RunLease:
    """The lease of one run folder, held by this driver from :meth:`acquire` to :meth:`release`.

    ``storage`` is the run's ``RunStorage`` (``fs``, ``run_path``, ``is_local``, ``uri()``).
    """

    def __init__(self, storage: Any):
        self.storage = storage
        self.fs = storage.fs
        self.record: LeaseRecord | None = None
        self.previous: LeaseRecord | None = None  # the stale or released lease this one replaced
        self.lost: str | None = None  # why this driver no longer owns the run, once it does not
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._etag: str | None = None

    # -- acquiring -----------------------------------------------------------------

    def acquire(self) -> LeaseRecord:
        """Own the run, or raise :class:`RunInUseError` naming the live owner and the choices."""
        for _ in range(5):  # lost races against other contenders for a stale lease
            current = self._current()
            if current is not None:
                reason = current.stale_reason()
                if reason is None and _ended_in_this_process(current):
                    reason = "its driver in this process ended without recording the release"
                if reason is None:
                    raise self._in_use(current)
                self.previous = current
            record = LeaseRecord.mine(generation=(current.generation if current else 0) + 1)
            # Held here before the file exists: another thread of this process that reads the new lease
            # as soon as it is created must see a live owner, not one that "ended in this process".
            _HELD_HERE.add(record.owner_id)
            created = False
            try:
                created = self._create(self._path(record.generation), record.to_bytes())
            finally:
                if not created:  # lost the race, or storage failed: nothing of ours to hold
                    _HELD_HERE.discard(record.owner_id)
            if created:
                self.record = record
                if current is not None and current.released_at is None:
                    logger.warning(
                        "Run %s: taking over from its previous driver (%s): %s.",
                        self.storage.uri(),
                        current.describe(),
                        reason,
                    )
                self._remove_older(record.generation)
                self._thread = threading.Thread(target=self._heartbeat_loop, name="trainlib-lease", daemon=True)
                self._thread.start()
                return record
        current = self._current()
        raise (
            self._in_use(current)
            if current
            else RunInUseError(f"Could not take the lease of run {self.storage.uri()}: other drivers kept winning it.")
        )

    def _in_use(self, owner: LeaseRecord) -> RunInUseError:
        return RunInUseError(
            f"The run {self.storage.uri()} is being trained by another driver ({owner.describe()}). Two drivers "
            "would write the same checkpoints and metrics. Choices: wait for it to finish; stop it (its lease "
            f"expires {owner.ttl_s:.0f}s after its last heartbeat, or at once when its process is gone on this "
            "host) and run again to resume it; or pick another RunConfig.name."
        )

    def _path(self, generation: int) -> str:
        return posixpath.join(self.storage.run_path, lease_file_name(generation))

    def _generations(self) -> list[int]:
        self.fs.invalidate_cache(self.storage.run_path)
        try:
            names = self.fs.glob(posixpath.join(self.storage.run_path, LEASE_PREFIX + "*.json"))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            digits = posixpath.basename(name)[len(LEASE_PREFIX) : -len(".json")]
            if digits.isdigit():
                out.append(int(digits))
        return sorted(out)

    def _current(self) -> LeaseRecord | None:
        for _ in range(10):
            generations = self._generations()
            if not generations:
                return None
            generation = generations[-1]
            try:
                return LeaseRecord.from_bytes(self.fs.cat_file(self._path(generation)))
            except FileNotFoundError:
                # Removed since the listing: only a newer owner removes a generation, so list again rather
                # than fall back to an older (or no) lease and create a generation that already had an owner.
                continue
            except (ValueError, TypeError):
                # Lease files are created whole; an unreadable one is damage: treat it as stale.
                logger.warning("Ignoring unreadable lease file %s", self.storage.uri(self._path(generation)))
                return LeaseRecord(
                    generation=generation,
                    owner_id="",
                    host="?",
                    boot_id="",
                    pid=0,
                    pid_start=None,
                    started_at=0.0,
                    heartbeat_at=0.0,
                    ttl_s=0.0,
                )
        raise RunInUseError(
            f"The lease of run {self.storage.uri()} kept changing while it was read: other drivers "
            "are taking the run over. Wait for them to finish, or pick another RunConfig.name."
        )

    def _create(self, path: str, data: bytes) -> bool:
        """Create ``path`` holding ``data`` unless it exists; False when another driver was first."""
        if self.storage.is_local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{uuid.uuid4().hex[:8]}.new"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)  # atomic create-if-absent, on NFS too
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        if protocol in ("s3", "s3a"):
            try:
                out = self.fs.pipe_file(path, data, mode="create")  # PUT with If-None-Match: *
            except FileExistsError:
                return False
            self._etag = (out or {}).get("ETag")
            return True
        try:
            with self.fs.open(path, "xb") as f:
                f.write(data)
            return True
        except FileExistsError:
            return False
        except (ValueError, NotImplementedError):  # no exclusive mode: write, then check that it is ours
            if self.fs.exists(path):
                return False
            self.storage.write_bytes_atomic(path, data)  # makes the folders a pyarrow filesystem needs
            time.sleep(0.5)
            return self.fs.cat_file(path) == data

    def _remove_older(self, generation: int) -> None:
        for older in self._generations():
            if older < generation:
                try:
                    self.fs.rm(self._path(older))
                except FileNotFoundError:
                    pass

    # -- holding -------------------------------------------------------------------

    def check(self) -> None:
        """Raise RunInUseError when this driver lost the run to another one (called before each commit)."""
        if self.lost:
            raise RunInUseError(
                f"This driver no longer owns the run {self.storage.uri()}: {self.lost}. It stops "
                "without committing, so the new owner's checkpoints are not overwritten."
            )

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(tunables.LEASE_HEARTBEAT_S):
            try:
                self.heartbeat()
            except Exception as exc:  # noqa: BLE001 - storage blips: the TTL covers several beats
                logger.warning(
                    "Run lease heartbeat failed (%s: %s); retrying in %.0fs",
                    type(exc).__name__,
                    exc,
                    tunables.LEASE_HEARTBEAT_S,
                )
            if self.lost:
                logger.error("Run %s: %s", self.storage.uri(), self.lost)
                return

    def heartbeat(self) -> None:
        """Refresh this driver's lease, or set :attr:`lost` when another driver took the run over."""
        assert self.record is not None
        newer = [g for g in self._generations() if g > self.record.generation]
        if newer:
            self.lost = f"another driver took the run over (lease generation {newer[-1]})"
            return
        path = self._path(self.record.generation)
        if not self.fs.exists(path):
            self.lost = "its lease file was removed"
            return
        self.record = dataclasses.replace(self.record, heartbeat_at=time.time())
        self._write_own(path, self.record.to_bytes())

    def _write_own(self, path: str, data: bytes) -> None:
        if self.storage.is_local:
            atomic_write(path, data)
        elif self._etag:
            try:  # only if it is still the object this driver wrote
                out = self.fs.pipe_file(path, data, IfMatch=self._etag)
                self._etag = (out or {}).get("ETag")
            except OSError as exc:
                if "pre-condition" in str(exc).lower() or "precondition" in str(exc).lower():
                    self.lost = "its lease file was changed by another driver"
                    return
                raise
        else:
            self.fs.pipe_file(path, data)

    def release(self) -> None:
        """Stop the heartbeat and mark the lease released, so the next driver takes the run at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.record is not None:
            _HELD_HERE.discard(self.record.owner_id)
        if self.record is None or self.lost:
            return
        self.record = dataclasses.replace(self.record, released_at=time.time())
        try:
            self._write_own(self._path(self.record.generation), self.record.to_bytes())
        except Exception as exc:  # noqa: BLE001 - the lease then expires after its TTL
            logger.warning(
                "Could not release the run lease of %s (%s); it expires in %.0fs.",
                self.storage.uri(),
                exc,
                tunables.LEASE_TTL_S,
            )


def _ended_in_this_process(lease: LeaseRecord) -> bool:
    return lease.pid == os.getpid() and lease.host == socket.gethostname() and lease.owner_id not in _HELD_HERE


def read_lease(storage: Any) -> LeaseRecord | None:
    """The current lease of a run folder, or None (runs from before leases, or never started)."""
    return RunLease(storage)._current()
