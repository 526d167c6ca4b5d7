"""The offline spool: tracking calls that could not be sent, kept in a local JSON-lines file. Driver only."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable
from typing import Any

from trainlib._internal.util.atomic import atomic_write
from trainlib._internal.util.paths import expand_path, is_url

SPOOL_FILE = "mlflow_spool.jsonl"
DEFAULT_SPOOL_DIR = "~/.trainlib/mlflow_spool"  # for runs whose storage is not local


def spool_file(run_name: str, run_path: str, spool_dir: str | None = None) -> str:
    """Where a run's unsent tracking calls are spooled: in ``spool_dir`` if given, else in the run folder when it is
    local, else in :data:`DEFAULT_SPOOL_DIR`."""
    if spool_dir is not None:
        return os.path.join(spool_dir, f"{run_name}.{SPOOL_FILE}")
    if not is_url(run_path) or run_path.startswith("file://"):
        local = run_path[len("file://") :] if run_path.startswith("file://") else run_path
        return os.path.join(local, SPOOL_FILE)
    return os.path.join(expand_path(DEFAULT_SPOOL_DIR), f"{run_name}.{SPOOL_FILE}")


class Spool:
    """An append-only JSON-lines file of tracking calls that could not be sent.

    Each line is one record, e.g. ``{"kind": "metrics", "run_id": ..., "step": 3,
    "metrics": {...}}``. Records are replayed in order; what still fails is
    written back, so a replay can be retried as often as needed.
    """

    def __init__(self, path: str):
        self.path = expand_path(path)
        self._lock = threading.Lock()

    def append(self, record: dict[str, Any]) -> None:
        with self._lock:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def read(self) -> list[dict[str, Any]]:
        if not os.path.exists(self.path):
            return []
        records = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    records.append(json.loads(line))
        return records

    def rewrite(self, records: Iterable[dict[str, Any]]) -> None:
        """Replace the spool's content with ``records`` (delete the file when there are none)."""
        records = list(records)
        with self._lock:
            if not records:
                if os.path.exists(self.path):
                    os.remove(self.path)
                return
            atomic_write(self.path, "".join(json.dumps(r, default=str) + "\n" for r in records).encode("utf-8"))

    def __len__(self) -> int:
        return len(self.read())


def describe_records(records: list[dict[str, Any]]) -> str:
    """A one-line account of spooled records: which metric steps and keys, artifacts, status."""
    parts = []
    steps = sorted({r["step"] for r in records if r["kind"] == "metrics"})
    if steps:
        keys = sorted({k for r in records if r["kind"] == "metrics" for k in r["metrics"]})
        parts.append(f"metrics {', '.join(keys)} at steps {_ranges(steps)}")
    params = sorted({k for r in records if r["kind"] == "params" for k in r["params"]})
    if params:
        parts.append(f"params {', '.join(params)}")
    tags = sorted({k for r in records if r["kind"] == "tags" for k in r["tags"]})
    if tags:
        parts.append(f"tags {', '.join(tags)}")
    artifacts = [r["artifact_path"] for r in records if r["kind"] == "artifacts"]
    if artifacts:
        parts.append(f"artifacts {', '.join(artifacts)}")
    statuses = [r["status"] for r in records if r["kind"] == "status"]
    if statuses:
        parts.append(f"the final status {statuses[-1]}")
    return "; ".join(parts) or "nothing"


def _ranges(steps: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    out, start, prev = [], steps[0], steps[0]
    for step in steps[1:] + [None]:
        if step is not None and step == prev + 1:
            prev = step
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if step is not None:
            start = prev = step
    return ", ".join(out)
