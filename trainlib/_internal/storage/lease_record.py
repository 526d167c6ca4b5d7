"""A run lease's record: who owns the run, since when, its heartbeat, and whether it went stale. Driver only.

See :mod:`trainlib._internal.storage.lease` for the protocol that creates and refreshes it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import time
import uuid

from trainlib._internal import tunables

LEASE_PREFIX = "trainlib_lease_"


def lease_file_name(generation: int) -> str:
    return f"{LEASE_PREFIX}{generation:06d}.json"


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux), None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """What a lease file says: who owns the run, since when, and when it last said so."""

    generation: int
    owner_id: str
    host: str
    boot_id: str
    pid: int
    pid_start: int | None
    started_at: float
    heartbeat_at: float
    ttl_s: float
    released_at: float | None = None

    @classmethod
    def mine(cls, generation: int, started_at: float | None = None) -> LeaseRecord:
        now = time.time()
        return cls(
            generation=generation,
            owner_id=uuid.uuid4().hex,
            host=socket.gethostname(),
            boot_id=_boot_id(),
            pid=os.getpid(),
            pid_start=_process_start(os.getpid()),
            started_at=started_at or now,
            heartbeat_at=now,
            ttl_s=tunables.LEASE_TTL_S,
        )

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LeaseRecord:
        raw = json.loads(data)
        return cls(**{f.name: raw.get(f.name) for f in dataclasses.fields(cls)})

    def owner_gone(self) -> bool:
        """Whether the owner process is known dead: same host and boot, and its pid is gone or reused."""
        if self.host != socket.gethostname() or not self.boot_id or self.boot_id != _boot_id():
            return False
        start = _process_start(self.pid)
        return start is None or (self.pid_start is not None and start != self.pid_start)

    def stale_reason(self, now: float | None = None) -> str | None:
        """Why this lease no longer holds the run, or None while its owner holds it."""
        now = time.time() if now is None else now
        if self.released_at is not None:
            return f"released at {_fmt_time(self.released_at)}"
        if self.owner_gone():
            return f"its owner process (pid {self.pid} on {self.host}) is gone"
        if now - self.heartbeat_at > self.ttl_s:
            return f"no heartbeat for {now - self.heartbeat_at:.0f}s (TTL {self.ttl_s:.0f}s)"
        return None

    def describe(self) -> str:
        return (
            f"host {self.host}, pid {self.pid}, started {_fmt_time(self.started_at)}, "
            f"last heartbeat {time.time() - self.heartbeat_at:.0f}s ago"
        )


def _fmt_time(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
