"""The run record ``trainlib_run.json``: one run's configs, status and callbacks' state. Driver only.

The record is written when the run is created, when it starts running and when
it ends (atomically each time); ``Result.from_path``, ``restore`` and callbacks
such as ``MLflowLogger`` (its MLflow run id, under ``callbacks``) read it back.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainlib._internal.storage.run_storage import RunStorage

RUN_STATE_FILE = "trainlib_run.json"


class RunStatus(enum.Enum):
    """A run's status: the controller's state while it runs, the run record's status once written."""

    PENDING = "PENDING"  # created, no worker started yet
    SCHEDULING = "SCHEDULING"  # reserving resources and starting the worker group
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"  # a worker failed; the group restarts from the latest checkpoint
    FINISHED = "FINISHED"
    FAILED = "FAILED"


@dataclasses.dataclass
class RunFailure:
    """One worker failure of the run, as recorded."""

    rank: int
    cause: str


@dataclasses.dataclass
class RunRecord:
    """The content of ``trainlib_run.json``."""

    name: str
    storage_path: str
    trainlib_version: str
    train_loop_config: dict[str, Any] | None
    scaling_config: dict[str, Any]
    checkpoint_config: dict[str, Any]
    failure_config: dict[str, Any]
    status: RunStatus = RunStatus.PENDING
    created_at: float = dataclasses.field(default_factory=time.time)
    resumed: int = 0  # how many times the run was continued by a later fit()
    callbacks: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)  # Callback.state_key -> state
    error: str | None = None
    failures: list[RunFailure] = dataclasses.field(default_factory=list)
    ended_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["status"] = RunStatus(values.get("status", RunStatus.PENDING.value))
        values["failures"] = [RunFailure(**f) for f in values.get("failures") or []]
        values["callbacks"] = dict(values.get("callbacks") or {})
        for name in ("scaling_config", "checkpoint_config", "failure_config"):
            values.setdefault(name, {})
        values.setdefault("train_loop_config", None)
        values.setdefault("trainlib_version", "")
        values.setdefault("storage_path", "")
        return cls(**values)

    def save(self, storage: RunStorage) -> None:
        storage.write_json_atomic(storage.join(RUN_STATE_FILE), self.to_json())

    @classmethod
    def load(cls, storage: RunStorage) -> RunRecord:
        return cls.from_json(storage.read_json(storage.join(RUN_STATE_FILE)))
