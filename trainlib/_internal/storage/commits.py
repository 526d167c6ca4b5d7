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


def merge_manifests(by_rank: dict[int, dict[str, int]]) -> tuple[dict[str, int], dict[str, list[int]]]:
    """One checkpoint's files from every rank's manifest, and the files that several ranks wrote (by name)."""
    merged: dict[str, int] = {}
    writers: dict[str, list[int]] = {}
    for rank in sorted(by_rank):
        for rel, size in by_rank[rank].items():
            merged[rel] = size
            writers.setdefault(rel, []).append(rank)
    return merged, {rel: ranks for rel, ranks in writers.items() if len(ranks) > 1}
