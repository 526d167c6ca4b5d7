"""A worker's local staging of checkpoints bound for remote storage, and their recovery. Worker actors only.

With remote storage, ``report()`` copies the checkpoint into a staging folder on the node
(``$TMPDIR/trainlib_stage_rank<r>_pid<p>_*``) and an uploader thread uploads it in the
background. Each staged step gets a small record, ``step_<n>.json``, written after its files,
so a worker process that dies (OOM, SIGKILL) leaves on its node everything needed to finish
its uploads: the driver then runs :func:`finish_staged_uploads` on that node, before it
decides where the restart resumes (see ``RayWorkerGroup``). Staging folders of dead
processes are swept when a worker starts.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import time
from typing import Any

from trainlib._internal.execution.messages import ReportMessage
from trainlib._internal.storage.checkpoint_files import checkpoint_files
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.checkpoint import Checkpoint

_PREFIX = "trainlib_stage_rank"
# Staging folders of dead processes from other runs are swept only after this long: their
# driver may still be recovering them.
_FOREIGN_SWEEP_AGE_S = 3600.0


def make_staging_root(rank: int, run_path: str) -> str:
    """A new staging folder for this worker process; sweeps those that dead workers left behind."""
    sweep(run_path)
    root = tempfile.mkdtemp(prefix=f"{_PREFIX}{rank}_pid{os.getpid()}_")
    with open(os.path.join(root, "run.json"), "w") as f:
        json.dump({"run_path": run_path}, f)
    return root


def stage_checkpoint(checkpoint: Checkpoint, staged_dir: str) -> None:
    """Copy ``checkpoint`` into ``staged_dir``, never following a symlink out of it (see checkpoint_files)."""
    if not checkpoint.is_local:
        checkpoint.to_directory(staged_dir)
        return
    for item in checkpoint_files(checkpoint.path):
        dest = os.path.join(staged_dir, *item.rel.split("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(item.local_path, dest)


def write_record(staged_dir: str, step: int, metrics: dict[str, Any], reported_at: float,
                 manifest: dict[str, int] | None = None) -> None:
    """Record a staged step (after its files), or, with ``manifest``, that its upload is done."""
    path = f"{staged_dir}.json"
    tmp = f"{path}.new"
    with open(tmp, "w") as f:
        json.dump({"step": step, "metrics": metrics, "reported_at": reported_at, "manifest": manifest}, f)
    os.replace(tmp, path)


def finish_staged_uploads(storage: RunStorage, rank: int, pid: int) -> list[ReportMessage]:
    """On the dead worker's node: upload what worker ``pid`` (rank ``rank``) staged; return its REPORT messages."""
    messages = []
    for root in glob.glob(os.path.join(tempfile.gettempdir(), f"{_PREFIX}{rank}_pid{pid}_*")):
        if _run_of(root) != storage.run_path:
            continue
        records = []
        for record_path in glob.glob(os.path.join(root, "step_*.json")):
            try:
                with open(record_path) as f:
                    records.append(json.load(f))
            except ValueError:
                continue  # written as .new then renamed: a torn record is never under this name
        for record in sorted(records, key=lambda r: r["step"]):
            manifest = record["manifest"]
            staged_dir = os.path.join(root, f"step_{record['step']}")
            if manifest is None and os.path.isdir(staged_dir):
                manifest = storage.upload_directory(staged_dir, storage.checkpoint_path(record["step"]))
            messages.append(ReportMessage(rank=rank, step=record["step"], metrics=record["metrics"], manifest=manifest,
                                          reported_at=record["reported_at"]))
        shutil.rmtree(root, ignore_errors=True)
    return messages


def sweep(run_path: str) -> None:
    """Remove staging folders of dead worker processes: of this run at once, of others after an hour."""
    for root in glob.glob(os.path.join(tempfile.gettempdir(), f"{_PREFIX}*_pid*_*")):
        try:
            pid = int(os.path.basename(root).split("_pid", 1)[1].split("_", 1)[0])
            age = time.time() - os.path.getmtime(root)
        except (ValueError, IndexError, OSError):
            continue
        if _alive(pid):
            continue
        if _run_of(root) == run_path or age > _FOREIGN_SWEEP_AGE_S:
            shutil.rmtree(root, ignore_errors=True)


def _run_of(root: str) -> str | None:
    try:
        with open(os.path.join(root, "run.json")) as f:
            return json.load(f).get("run_path")
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
