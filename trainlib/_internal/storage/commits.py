"""Checkpoint commits: the marker file's name, checkpoint folder names, a verified commit. Driver and workers."""

from __future__ import annotations

import dataclasses
from typing import Any

COMMIT_MARKER = ".trainlib_commit.json"
CHECKPOINT_PREFIX = "checkpoint_"


def checkpoint_dir_name(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step:06d}"


@dataclasses.dataclass(frozen=True)
class CommittedCheckpoint:
    """A checkpoint whose commit marker was found and verified."""

    step: int
    path: str
    metrics: dict[str, Any]
    committed_at: float
