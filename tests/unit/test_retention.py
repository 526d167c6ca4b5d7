"""Checkpoint retention (CheckpointConfig): which checkpoints are kept, in which order. No cluster."""

from __future__ import annotations

import logging
import math

import pytest

from trainlib._internal.storage.commits import CommittedCheckpoint
from trainlib._internal.storage.retention import (
    best_checkpoints,
    checkpoints_to_delete,
    rank_checkpoints,
    warn_if_unscored,
)
from trainlib.config import CheckpointConfig


def ckpts(*scores):
    """Checkpoints at steps 1..n with metric ``acc`` (None: the metric is missing)."""
    return [
        CommittedCheckpoint(
            step=i + 1,
            path=f"/r/checkpoint_{i + 1:06d}",
            metrics={} if s is None else {"acc": s},
            committed_at=float(i),
        )
        for i, s in enumerate(scores)
    ]


def steps(checkpoints):
    return sorted(c.step for c in checkpoints)


def kept(checkpoints, config, keep_latest=True):
    doomed = {c.step for c in checkpoints_to_delete(checkpoints, config, keep_latest)}
    return [c.step for c in checkpoints if c.step not in doomed]


def test_num_to_keep_none_keeps_everything():
    all_ = ckpts(0.1, 0.9, 0.5, 0.2)
    assert checkpoints_to_delete(all_, CheckpointConfig()) == []
    assert checkpoints_to_delete(all_, CheckpointConfig(checkpoint_score_attribute="acc")) == []


def test_without_score_keeps_the_latest_n():
    all_ = ckpts(0.9, 0.8, 0.7, 0.1, 0.2)
    assert kept(all_, CheckpointConfig(num_to_keep=2)) == [4, 5]
    assert [c.step for c in rank_checkpoints(all_, CheckpointConfig())] == [1, 2, 3, 4, 5]  # Ray: report order


def test_max_order_keeps_the_highest_scores_and_the_latest():
    all_ = ckpts(0.5, 0.9, 0.7, 0.8, 0.1)
    config = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc", checkpoint_score_order="max")
    assert [c.step for c in rank_checkpoints(all_, config)] == [5, 1, 3, 4, 2]  # Ray: best last
    assert [c.step for c in best_checkpoints(all_, config)] == [4, 2]
    # Best two are steps 2 and 4; step 5 is the latest, so it stays too while the run is unfinished.
    assert kept(all_, config) == [2, 4, 5]
    # A finished run keeps exactly the two best.
    assert kept(all_, config, keep_latest=False) == [2, 4]


def test_min_order_keeps_the_lowest_scores_and_the_latest():
    all_ = ckpts(0.5, 0.9, 0.2, 0.3, 0.7)
    config = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc", checkpoint_score_order="min")
    assert [c.step for c in rank_checkpoints(all_, config)] == [2, 5, 1, 4, 3]
    assert kept(all_, config) == [3, 4, 5]
    assert kept(all_, config, keep_latest=False) == [3, 4]


def test_latest_is_kept_even_when_it_is_the_worst():
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="acc")
    assert kept(ckpts(0.9, 0.1), config) == [1, 2]
    # When the latest is also the best, only it remains.
    assert kept(ckpts(0.1, 0.9), config) == [2]


def test_missing_or_nan_score_ranks_last_and_warns(caplog):
    all_ = ckpts(0.3, None, math.nan, 0.6, 0.2)
    for order in ("max", "min"):
        config = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc", checkpoint_score_order=order)
        ranked = [c.step for c in rank_checkpoints(all_, config)]
        assert set(ranked[:2]) == {2, 3}, (order, ranked)
    config = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc", checkpoint_score_order="min")
    assert kept(all_, config) == [1, 5]
    with caplog.at_level(logging.WARNING, logger="trainlib"):
        warn_if_unscored(all_[1], config)
    assert "has no metric 'acc'" in caplog.text and "checkpoint_score_attribute" in caplog.text


def test_ties_prefer_the_newer_checkpoint():
    config = CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="acc")
    assert [c.step for c in rank_checkpoints(ckpts(0.5, 0.5, 0.1), config)][-2:] == [1, 2]
    assert [c.step for c in best_checkpoints(ckpts(0.5, 0.5, 0.1), config)] == [2]


def test_applying_retention_repeatedly_is_stable():
    """As in the controller: retention after every commit keeps exactly the best N plus the latest."""
    config = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="acc", checkpoint_score_order="max")
    scores = [0.2, 0.8, 0.4, 0.9, 0.3, 0.1]
    live: list[CommittedCheckpoint] = []
    for c in ckpts(*scores):
        live.append(c)
        for doomed in checkpoints_to_delete(live, config):
            live.remove(doomed)
        assert len(live) <= 3 and c in live
    assert steps(live) == [2, 4, 6]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_num_to_keep_must_be_positive(bad):
    with pytest.raises(ValueError, match="num_to_keep"):
        CheckpointConfig(num_to_keep=bad)


def test_score_order_is_checked():
    with pytest.raises(ValueError, match="checkpoint_score_order='best'.*'max'"):
        CheckpointConfig(checkpoint_score_order="best")


def nested(*losses):
    return [
        CommittedCheckpoint(
            step=i + 1, path=f"/r/checkpoint_{i + 1:06d}", metrics={"val": {"loss": v}}, committed_at=float(i)
        )
        for i, v in enumerate(losses)
    ]


def test_a_slash_path_scores_nested_metrics_as_ray_train_does(caplog):
    config = CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="val/loss", checkpoint_score_order="min")
    all_ = nested(0.9, 0.2, 0.5, 0.7)
    assert [c.step for c in best_checkpoints(all_, config)] == [3, 2]  # best last
    with caplog.at_level(logging.WARNING, logger="trainlib"):
        warn_if_unscored(all_[0], config)
    assert caplog.records == []  # the nested metric is found: no "has no metric" warning


def test_lookup_metric_prefers_a_flat_name_then_walks_dicts_and_lists():
    from trainlib._internal.metrics import lookup_metric

    metrics = {"val/loss": 1.0, "val": {"loss": 2.0, "acc": [0.5, 0.75]}, "x": 3}
    assert lookup_metric(metrics, "val/loss") == 1.0
    assert lookup_metric({"val": {"loss": 2.0}}, "val/loss") == 2.0
    assert lookup_metric(metrics, "val/acc/1") == 0.75 and lookup_metric(metrics, "val/acc/-1") == 0.75
    assert lookup_metric(metrics, "val/acc/2") is None and lookup_metric(metrics, "x/y") is None
    assert lookup_metric(metrics, "missing", default=-1) == -1


def _result(*metric_dicts):
    from trainlib import Checkpoint, Result

    best = [(Checkpoint(f"/r/checkpoint_{i:06d}"), m) for i, m in enumerate(metric_dicts, 1)]
    return Result(metrics=metric_dicts[-1] if metric_dicts else None, checkpoint=None, path="/r", best_checkpoints=best)


def test_get_best_checkpoint_picks_by_metric_and_mode_skipping_checkpoints_without_it():
    result = _result(
        {"loss": 0.5, "val": {"acc": 0.1}}, {"loss": 0.2}, {"other": 1}, {"loss": 0.9, "val": {"acc": 0.8}}
    )
    assert result.get_best_checkpoint("loss", "min").path.endswith("checkpoint_000002")
    assert result.get_best_checkpoint("loss", "max").path.endswith("checkpoint_000004")
    assert result.get_best_checkpoint("val/acc", "max").path.endswith("checkpoint_000004")
    with pytest.raises(ValueError, match="mode='min' or mode='max'"):
        result.get_best_checkpoint("loss", "lowest")
    with pytest.raises(RuntimeError, match=r"metric='acc'.*\['loss', 'other', 'val'\]"):
        result.get_best_checkpoint("acc", "max")
    with pytest.raises(RuntimeError, match="kept no checkpoint"):
        _result().get_best_checkpoint("loss", "min")
