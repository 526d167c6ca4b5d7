"""Replaying the offline spool into MLflow: ``SpoolReplay`` and ``replay_spool``. Driver only."""

from __future__ import annotations

import dataclasses
import logging
import os

from mlflow.tracking import MlflowClient

from trainlib._internal.tracking.spool import Spool, describe_records
from trainlib.mlflow._records import is_rejected, send_record
from trainlib.mlflow._store import bounded_http
from trainlib.mlflow.errors import short_error

logger = logging.getLogger("trainlib")


@dataclasses.dataclass(frozen=True)
class SpoolReplay:
    """The outcome of :meth:`MLflowLogger.replay_spool`.

    Attributes:
        path: the spool file.
        sent: records sent to MLflow now.
        remaining: records still in the spool (the server is still unreachable).
        rejected: records MLflow refused for good, each described in a line.
    """

    path: str
    sent: int
    remaining: int
    rejected: tuple[str, ...] = ()


def replay_spool(path: str | os.PathLike, tracking_uri: str | None = None) -> SpoolReplay:
    """Send the records spooled at ``path`` to MLflow, oldest first.

    Records that still cannot be sent stay in the file, so a replay can be
    repeated; records MLflow rejects for good are dropped and listed in the
    result (and logged). The file is deleted once it is empty.

    Args:
        path: the spool file (``logger.spool_path``, named in the warning).
        tracking_uri: where to send; default the URI each record was made
            for (give it when that URI held a password, which is never spooled).

    Example:
        >>> MLflowLogger.replay_spool("/runs/fashion/mlflow_spool.jsonl")
        SpoolReplay(path=..., sent=12, remaining=0, rejected=())
    """
    spool = Spool(os.fspath(path))
    records = spool.read()
    clients: dict[str, MlflowClient] = {}
    sent, rejected, left = 0, [], []
    with bounded_http():
        for i, record in enumerate(records):
            uri = tracking_uri or record["tracking_uri"]
            client = clients.setdefault(uri, MlflowClient(tracking_uri=uri))
            try:
                send_record(client, record)
                sent += 1
            except Exception as exc:  # noqa: BLE001 - sorted into rejected / still pending
                if is_rejected(exc):
                    line = f"{describe_records([record])} of run {record['run_id']}: {short_error(exc)}"
                    logger.warning("MLflow rejected a spooled record, dropped it: %s", line)
                    rejected.append(line)
                    continue
                left = records[i:]  # keep order: everything from the first failure stays
                break
    spool.rewrite(left)
    return SpoolReplay(path=spool.path, sent=sent, remaining=len(left), rejected=tuple(rejected))
