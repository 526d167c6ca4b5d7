"""Skipping unchanged weeks and the fine-tuning schedule, as pure functions."""

from __future__ import annotations

from tasks.domain.data_change import data_change
from tasks.domain.recipe import fine_tuning, get_recipe
from tasks.domain.snapshot import Snapshot, SnapshotEntry


def _snapshot(*hashes: str) -> Snapshot:
    return Snapshot("/data", tuple(SnapshotEntry(f"{h}.png", "cat", "train", h, 10, "b0") for h in hashes))


def test_no_new_images_since_the_champions_snapshot_is_nothing_new():
    champion = _snapshot("a", "b")
    same = data_change(_snapshot("b", "a"), champion, "3")
    assert same.nothing_new(1) and same.new_images == 0 and same.champion_digest == champion.digest
    assert same.message(1).startswith(f"no new data since {champion.digest} (champion version 3): nothing trained")
    import dataclasses

    assert not dataclasses.replace(same, rerun=True).nothing_new(1)  # a retried run goes on with its own snapshot
    grown = data_change(_snapshot("a", "b", "c"), champion, "3")
    assert grown.new_images == 1 and not grown.nothing_new(1) and grown.nothing_new(2)


def test_without_a_champion_snapshot_every_image_is_new_and_the_run_trains():
    change = data_change(_snapshot("a"), None, None)
    assert not change.nothing_new(1) and change.new_images == 1 and change.champion_digest is None


def test_fine_tuning_lowers_the_rate_and_shortens_the_run():
    recipe = get_recipe("augmented")
    tuned, epochs = fine_tuning(recipe, 10)
    assert tuned.lr == recipe.lr * recipe.finetune_lr_factor and epochs == 3
    assert fine_tuning(recipe, 1)[1] == 1 and tuned.architecture == recipe.architecture


def test_a_file_known_to_be_unusable_is_not_new_data(tmp_path):
    from tasks.domain.data_validation import FactsCache
    from tasks.domain.image_decode import ImageFacts

    FactsCache(str(tmp_path)).put({"bad": ImageFacts(error="not an image"), "c": ImageFacts(28, 28, 1)})
    change = data_change(_snapshot("a", "bad", "c"), _snapshot("a"), "1", str(tmp_path))
    assert change.new_images == 1  # "c" only: the corrupt file stays in the source, left out every week
