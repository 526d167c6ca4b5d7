"""Which committed checkpoints to keep (``CheckpointConfig``). Pure functions, driver only."""

from __future__ import annotations

import logging
import math

from trainlib._internal.storage.commits import CommittedCheckpoint
from trainlib.config import CheckpointConfig

logger = logging.getLogger("trainlib")


def _score(checkpoint: CommittedCheckpoint, config: CheckpointConfig) -> float:
    value = checkpoint.metrics.get(config.checkpoint_score_attribute)
    if not isinstance(value, (int, float)) or math.isnan(value):
        return -math.inf  # a checkpoint without the score ranks last
    return value if config.checkpoint_score_order == "max" else -value


def rank_checkpoints(checkpoints: list[CommittedCheckpoint], config: CheckpointConfig) -> list[CommittedCheckpoint]:
    """Best first: by score when ``checkpoint_score_attribute`` is set, else newest first."""
    if config.checkpoint_score_attribute is None:
        return sorted(checkpoints, key=lambda c: c.step, reverse=True)
    # Ties go to the newer checkpoint.
    return sorted(checkpoints, key=lambda c: (_score(c, config), c.step), reverse=True)


def checkpoints_to_delete(checkpoints: list[CommittedCheckpoint], config: CheckpointConfig) -> list[CommittedCheckpoint]:
    """The checkpoints that fall outside ``num_to_keep``; the latest one is never among them."""
    if config.num_to_keep is None or not checkpoints:
        return []
    latest = max(checkpoints, key=lambda c: c.step)
    keep = set(c.step for c in rank_checkpoints(checkpoints, config)[: config.num_to_keep])
    keep.add(latest.step)
    return [c for c in checkpoints if c.step not in keep]


def warn_if_unscored(checkpoint: CommittedCheckpoint, config: CheckpointConfig) -> None:
    attribute = config.checkpoint_score_attribute
    if attribute is not None and attribute not in checkpoint.metrics:
        logger.warning(
            "Checkpoint at step %d has no metric %r (CheckpointConfig.checkpoint_score_attribute); it ranks last. "
            "Report %r with every checkpoint. Reported metrics: %s",
            checkpoint.step, attribute, attribute, sorted(checkpoint.metrics),
        )
