"""What the driver settles when it commits a report: the checkpoint's folder and its metadata. Driver only."""

from __future__ import annotations

import json
import posixpath
from typing import Any

from trainlib._internal.execution.messages import CheckpointPlacement
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.checkpoint import METADATA_FILE
from trainlib.errors import WorkerError


def commit_folder(step: int, placements: list[CheckpointPlacement]) -> str | None:
    """The checkpoint folder name every rank used for ``step`` (None: the default ``checkpoint_<step>``)."""
    names = {p.dir_name for p in placements}
    if len(names) > 1:
        raise WorkerError(
            rank=0,
            cause=(
                f"the ranks put the checkpoint of report {step} in different folders ({sorted(names)}): pass the same "
                "checkpoint_dir_name to trainlib.report() on every rank"
            ),
        )
    return names.pop() if names else None


def write_metadata(
    storage: RunStorage, path: str, trainer_metadata: dict[str, Any] | None, manifest: dict[str, int]
) -> None:
    """Merge the trainer's ``metadata`` into the checkpoint's metadata file (the ranks' own keys win).

    The metadata file stays out of ``manifest``: ``Checkpoint.update_metadata`` may rewrite it later.
    """
    had_file = manifest.pop(METADATA_FILE, None) is not None
    if not trainer_metadata:
        return
    file_path = posixpath.join(path, METADATA_FILE)
    existing = json.loads(storage.fs.cat_file(file_path)) if had_file else {}
    storage.write_bytes_atomic(file_path, json.dumps({**trainer_metadata, **existing}).encode())


def check_arrived(step: int, uri: str, manifests: dict[int, dict[str, int]], stored: dict[str, int]) -> None:
    """Before the marker: every file a rank reported is in storage (``stored``) with its size.

    A file that several ranks wrote may hold any one's size (the last upload won): its name is checked.

    Raises:
        WorkerError: naming the checkpoint and the first rank whose files did not all arrive.
    """
    writers: dict[str, int] = {}
    for manifest in manifests.values():
        for rel in manifest:
            writers[rel] = writers.get(rel, 0) + 1
    for rank in sorted(manifests):
        lost = sorted(
            rel
            for rel, size in manifests[rank].items()
            if rel not in stored or (writers[rel] == 1 and stored[rel] != size)
        )
        if lost:
            raise WorkerError(
                rank=rank,
                cause=(
                    f"the checkpoint of report {step} ({uri}) is not committed: {len(lost)} of the files rank {rank} "
                    f"uploaded are missing there or have another size ({lost[:5]}). Something deleted or rewrote "
                    "them before the commit: nothing else may write into a run's checkpoint folders."
                ),
            )
