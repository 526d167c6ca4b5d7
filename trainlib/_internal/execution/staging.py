"""A worker's local staging of checkpoints bound for remote storage, and their recovery. Worker actors only.

With remote storage, ``report()`` copies the checkpoint into a staging folder on the node
(``$TMPDIR/trainlib_stage_rank<r>_pid<p>_*``) and an uploader thread uploads it in the
background. Each staged step gets a small record, ``step_<n>.json``, written after its files,
so a worker process that dies (OOM, SIGKILL) leaves on its node everything needed to finish
its uploads: the driver then runs :func:`finish_staged_uploads` on that node, before it
decides where the restart resumes (see ``RayWorkerGroup``). Staging folders of dead
processes are swept when a worker starts, except those of its own attempt (see :func:`sweep`).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import tempfile
import time
from typing import Any

from trainlib._internal.execution.messages import CheckpointPlacement, ReportMessage
from trainlib._internal.storage.checkpoint_files import checkpoint_files
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.checkpoint import Checkpoint

_PREFIX = "trainlib_stage_rank"
# Staging folders of dead processes from other runs are swept only after this long: their
# driver may still be recovering them.
_FOREIGN_SWEEP_AGE_S = 3600.0


@dataclasses.dataclass(frozen=True)
class _Owner:
    """Whose a staging folder is (its ``run.json``): the run and the attempt of the worker that made it."""

    run_path: str | None = None
    attempt: int | None = None


def make_staging_root(rank: int, run_path: str, attempt: int) -> str:
    """A new staging folder for this worker process; sweeps those that dead workers left behind."""
    sweep(run_path, attempt)
    root = tempfile.mkdtemp(prefix=f"{_PREFIX}{rank}_pid{os.getpid()}_")
    with open(os.path.join(root, "run.json"), "w") as f:
        json.dump(dataclasses.asdict(_Owner(run_path, attempt)), f)
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


def write_record(
    staged_dir: str,
    step: int,
    metrics: dict[str, Any],
    reported_at: float,
    placement: CheckpointPlacement | None,
    manifest: dict[str, int] | None = None,
) -> None:
    """Record a staged step (after its files), or, with ``manifest``, that its upload is done.

    ``placement`` is kept so that a recovery uploads into the folder the other ranks use for
    this step (a ``checkpoint_dir_name``) and reports it as this rank would have.
    """
    path = f"{staged_dir}.json"
    tmp = f"{path}.new"
    with open(tmp, "w") as f:
        json.dump(
            {
                "step": step,
                "metrics": metrics,
                "reported_at": reported_at,
                "manifest": manifest,
                "placement": dataclasses.asdict(placement) if placement is not None else None,
            },
            f,
        )
    os.replace(tmp, path)


def finish_staged_uploads(storage: RunStorage, rank: int, pid: int, attempt: int) -> list[ReportMessage]:
    """On the dead worker's node: upload what worker ``pid`` (rank ``rank``) staged in ``attempt``; return its
    REPORT messages. A folder of another attempt (an earlier driver's, whose pid the OS reused) is not this rank's."""
    messages = []
    for root in glob.glob(os.path.join(tempfile.gettempdir(), f"{_PREFIX}{rank}_pid{pid}_*")):
        if _owner_of(root) != _Owner(storage.run_path, attempt):
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
            placement = CheckpointPlacement(**record["placement"]) if record.get("placement") else None
            if manifest is None and os.path.isdir(staged_dir):
                dest = storage.checkpoint_path(record["step"], placement.dir_name if placement else None)
                manifest = storage.upload_directory(staged_dir, dest)
            messages.append(
                ReportMessage(
                    rank=rank,
                    step=record["step"],
                    metrics=record["metrics"],
                    manifest=manifest,
                    reported_at=record["reported_at"],
                    placement=placement,
                )
            )
        shutil.rmtree(root, ignore_errors=True)
    return messages


def sweep(run_path: str, attempt: int) -> None:
    """Remove staging folders of dead worker processes: of this run's other attempts at once, of others after an hour.

    A dead rank's folder of this very attempt stays: the driver may not have recovered it yet
    (:func:`finish_staged_uploads` removes it when it has). Nothing makes the ranks start
    together (no collective without a framework), so a rank may start after another one
    reported and died; sweeping then deleted the dead rank's staged reports.
    """
    for root in glob.glob(os.path.join(tempfile.gettempdir(), f"{_PREFIX}*_pid*_*")):
        try:
            pid = int(os.path.basename(root).split("_pid", 1)[1].split("_", 1)[0])
            age = time.time() - os.path.getmtime(root)
        except (ValueError, IndexError, OSError):
            continue
        if _alive(pid):
            continue
        owner = _owner_of(root)
        if (owner.run_path == run_path and owner.attempt != attempt) or age > _FOREIGN_SWEEP_AGE_S:
            shutil.rmtree(root, ignore_errors=True)


def _owner_of(root: str) -> _Owner:
    try:
        with open(os.path.join(root, "run.json")) as f:
            record = json.load(f)
        return _Owner(record.get("run_path"), record.get("attempt"))
    except (OSError, ValueError, AttributeError):
        return _Owner()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
