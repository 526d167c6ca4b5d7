"""Sending tracking records: now, or into the spool while MLflow is unreachable, probing it again. Driver only.

A failed send is spooled and marks the store offline; while offline, records go
straight to the spool and at most every ``tunables.MLFLOW_RECONNECT_INTERVAL_S``
one replay of the spool probes the store. Nothing here raises: tracking never
fails training.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from mlflow.tracking import MlflowClient

from trainlib._internal import tunables
from trainlib._internal.tracking.spool import Spool, describe_records
from trainlib._internal.util.masking import redact_url
from trainlib.mlflow._records import is_rejected, send_record, spoolable
from trainlib.mlflow._spool import replay_spool
from trainlib.mlflow._store import bounded_http
from trainlib.mlflow.errors import short_error

logger = logging.getLogger("trainlib")


class RecordSender:
    """Sends one MLflow run's records through ``client``, spooling what cannot be sent."""

    def __init__(self, client: MlflowClient, uri: str, spool: Spool):
        self.client = client
        self.uri = uri
        self.spool = spool
        self.offline_since: float | None = None
        self._last_probe = 0.0

    def send(self, record: dict[str, Any]) -> None:
        """Send ``record`` now, or spool it when the tracking store is unreachable."""
        if self.offline_since is not None:
            if time.monotonic() - self._last_probe < tunables.MLFLOW_RECONNECT_INTERVAL_S:
                self.spool.append(spoolable(record))
                return
            self._last_probe = time.monotonic()
            if not self.replay():
                self.spool.append(spoolable(record))
                return
        try:
            with bounded_http():
                send_record(self.client, record)
        except Exception as exc:  # noqa: BLE001 - tracking never fails training
            if is_rejected(exc):
                logger.warning(
                    "MLflow rejected %s for run %s, not logged: %s",
                    describe_records([record]),
                    record.get("run_id"),
                    short_error(exc),
                )
                return
            self.spool.append(spoolable(record))
            self.offline_since = self._last_probe = time.monotonic()
            logger.warning(
                "MLflow tracking at %s failed (%s) while logging %s. Training goes on; what cannot be sent "
                "is spooled to %s and retried every %.0f s.",
                redact_url(self.uri),
                short_error(exc),
                describe_records([record]),
                self.spool.path,
                tunables.MLFLOW_RECONNECT_INTERVAL_S,
            )

    def replay(self) -> bool:
        """Try to send the spool; True when it is empty afterwards (back online)."""
        replay = replay_spool(self.spool.path, tracking_uri=self.uri)
        if replay.remaining:
            return False
        if self.offline_since is not None or replay.sent:
            logger.warning(
                "MLflow tracking at %s answers again: sent %d spooled record(s) from %s.",
                redact_url(self.uri),
                replay.sent,
                self.spool.path,
            )
        self.offline_since = None
        return True

    def pending(self) -> int:
        """Records still in the spool."""
        return len(self.spool)

    def finish(self, run_id: str, status: str) -> None:
        """At the run's end: send what is still spooled, or say what MLflow run ``run_id`` is missing and how
        to send it later."""
        if self.pending():
            self.replay()
        if self.pending():
            missing = describe_records([r for r in self.spool.read() if r["run_id"] == run_id])
            logger.warning(
                "MLflow run %s at %s is missing %s: the tracking server could not be reached. The records "
                "are spooled in %s; send them with trainlib.mlflow.MLflowLogger.replay_spool(%r) once the "
                "server is back (resuming this trainlib run also sends them). Checkpoints in run "
                "storage are intact.",
                run_id,
                redact_url(self.uri),
                missing,
                self.spool.path,
                self.spool.path,
            )
        else:
            logger.info("MLflow run %s ended %s", run_id, status)
