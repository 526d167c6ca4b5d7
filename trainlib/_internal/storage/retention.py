"""Which committed checkpoints to keep (``CheckpointConfig``). Pure functions, driver only."""

from __future__ import annotations

import logging
import math

from trainlib._internal.metrics import lookup_metric
from trainlib._internal.storage.commits import CommittedCheckpoint
from trainlib.config import CheckpointConfig

logger = logging.getLogger("trainlib")


def _score(checkpoint: CommittedCheckpoint, config: CheckpointConfig) -> float:
    value = lookup_metric(checkpoint.metrics, config.checkpoint_score_attribute)
    if not isinstance(value, (int, float)) or math.isnan(value):
        return -math.inf  # a checkpoint without the score ranks last
    return value if config.checkpoint_score_order == "max" else -value


def rank_checkpoints(checkpoints: list[CommittedCheckpoint], config: CheckpointConfig) -> list[CommittedCheckpoint]:
    """Ray Train's order, best last: by score when ``checkpoint_score_attribute`` is set (ties: the
    older first), else by report order."""
    if config.checkpoint_score_attribute is None:
        return sorted(checkpoints, key=lambda c: c.step)
    return sorted(checkpoints, key=lambda c: (_score(c, config), c.step))


def best_checkpoints(checkpoints: list[CommittedCheckpoint], config: CheckpointConfig) -> list[CommittedCheckpoint]:
    """The ``num_to_keep`` best checkpoints in Ray Train's order (``Result.best_checkpoints``)."""
    ranked = rank_checkpoints(checkpoints, config)
    return ranked if config.num_to_keep is None else ranked[-config.num_to_keep :]


def checkpoints_to_delete(
    checkpoints: list[CommittedCheckpoint], config: CheckpointConfig, keep_latest: bool = True
) -> list[CommittedCheckpoint]:
    """The checkpoints outside the ``num_to_keep`` best.

    ``keep_latest``: spare the latest one as well (the run is unfinished and may resume from it).
    """
    if config.num_to_keep is None or not checkpoints:
        return []
    keep = {c.step for c in best_checkpoints(checkpoints, config)}
    if keep_latest:
        keep.add(max(c.step for c in checkpoints))
    return [c for c in checkpoints if c.step not in keep]


def warn_if_unscored(checkpoint: CommittedCheckpoint, config: CheckpointConfig) -> None:
    attribute = config.checkpoint_score_attribute
    if attribute is not None and lookup_metric(checkpoint.metrics, attribute) is None:
        logger.warning(
            "Checkpoint at step %d has no metric %r (CheckpointConfig.checkpoint_score_attribute); it ranks last. "
            "Report %r with every checkpoint. Reported metrics: %s",
            checkpoint.step,
            attribute,
            attribute,
            sorted(checkpoint.metrics),
        )
