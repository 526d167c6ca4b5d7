"""The validation step's domain work on real files: unusable files, class changes, duplicates, counts, the spec.

No Ray or servers: :func:`validate_snapshot` on snapshots of generated folders (the pipeline test runs it as a
Prefect task on Ray).
"""

from __future__ import annotations

import shutil

import pytest
from data_helpers import png_bytes, shape_image, write_shapes

from tasks.domain.data_validation import (
    DataValidationError,
    FactsCache,
    ValidationSettings,
    image_facts,
    validate_snapshot,
)
from tasks.domain.snapshot import take_snapshot
from tasks.domain.snapshot_files import SnapshotReader

pytestmark = pytest.mark.integration  # reads and decodes files on disk; a few hundred ms


def _validate(source, cache, champion=None, **settings):
    snapshot = take_snapshot(str(source), cache_dir=str(cache))
    reader = SnapshotReader(snapshot, str(cache))
    return validate_snapshot(snapshot, reader, FactsCache(str(cache)), champion, ValidationSettings(**settings))


def test_corrupt_empty_non_image_and_tiny_files_are_named_and_left_out(tmp_path):
    source = tmp_path / "src"
    write_shapes(source, per_class=20, size=16, splits=True)
    (source / "train" / "circle" / "corrupt.png").write_bytes(png_bytes(shape_image("circle", 99, 16))[:40])
    (source / "train" / "square" / "empty.png").write_bytes(b"")
    (source / "train" / "stripe" / "notes.txt").write_text("not an image")
    (source / "test" / "stripe" / "tiny.png").write_bytes(png_bytes(shape_image("stripe", 98, 4)))
    result = _validate(source, tmp_path / "cache", max_bad_fraction=0.1)
    reasons = {p.path: p.reason for p in result.report.unusable}
    assert set(reasons) == {
        "train/circle/corrupt.png",
        "train/square/empty.png",
        "train/stripe/notes.txt",
        "test/stripe/tiny.png",
    }
    assert "not a decodable image" in reasons["train/circle/corrupt.png"]
    assert "empty file" in reasons["train/square/empty.png"]
    assert "too small: 4x4" in reasons["test/stripe/tiny.png"]
    kept = {e.path for e in result.snapshot.entries}
    assert not kept & set(reasons) and len(kept) == 60
    markdown = result.report.markdown()
    assert all(path in markdown for path in reasons), markdown
    assert result.spec.channels == 3 and (result.spec.height, result.spec.width) == (16, 16)

    with pytest.raises(DataValidationError) as info:  # 4 of 64 files is above a 5% threshold
        _validate(source, tmp_path / "cache", max_bad_fraction=0.05)
    message = str(info.value)
    assert "4 of 64 files are unusable" in message and "max_bad_fraction=0.05" in message
    assert all(path in message for path in reasons) and "Fix:" in message


def test_each_file_is_decoded_once_per_node(tmp_path):
    source, cache = tmp_path / "src", tmp_path / "cache"
    write_shapes(source, per_class=5, size=12)
    snapshot = take_snapshot(str(source), cache_dir=str(cache))
    reader = SnapshotReader(snapshot, str(cache))
    assert image_facts(snapshot, reader, FactsCache(str(cache)))[1] == 15
    write_shapes(source, per_class=1, size=12, start=50)
    grown = take_snapshot(str(source), cache_dir=str(cache))
    assert image_facts(grown, SnapshotReader(grown, str(cache)), FactsCache(str(cache)))[1] == 3


def test_a_new_or_vanished_class_stops_the_run_unless_allowed(tmp_path):
    source, cache = tmp_path / "src", tmp_path / "cache"
    write_shapes(source, per_class=10, size=12)
    champion = _validate(source, cache).snapshot
    (source / "triangle").mkdir()
    for i in range(10):
        (source / "triangle" / f"{i}.png").write_bytes(png_bytes(shape_image("circle", 500 + i, 12)))
    with pytest.raises(DataValidationError) as info:
        _validate(source, cache, champion)
    message = str(info.value)
    assert "classes changed against the champion's snapshot" in message
    assert "new ['triangle'], vanished none" in message and "allow_class_changes=true" in message

    allowed = _validate(source, cache, champion, allow_class_changes=True)
    assert allowed.report.new_classes == ("triangle",)
    assert allowed.spec.class_names == ("circle", "square", "stripe", "triangle")
    row = next(r for r in allowed.report.rows() if r["class"] == "triangle")
    assert row["champion train"] == "" and row["change"] == ""

    shutil.rmtree(source / "stripe")
    with pytest.raises(DataValidationError, match=r"vanished \['stripe'\]"):
        _validate(source, cache, champion, allow_class_changes=False)


def test_counts_and_their_change_against_the_champion(tmp_path):
    source, cache = tmp_path / "src", tmp_path / "cache"
    write_shapes(source, per_class=10, size=12, splits=True)
    champion = _validate(source, cache).snapshot
    write_shapes(source, per_class=5, size=12, splits=True, start=10)
    rows = {r["class"]: r for r in _validate(source, cache, champion).report.rows()}
    assert rows["circle"]["train"] == 12 and rows["circle"]["test"] == 3
    assert rows["circle"]["champion train"] == 8 and rows["circle"]["change"] == "+4 train, +1 test"


def test_a_test_image_also_in_training_is_reported_and_kept_out_of_training(tmp_path):
    source, cache = tmp_path / "src", tmp_path / "cache"
    write_shapes(source, per_class=10, size=12, splits=True)
    shutil.copyfile(source / "test" / "circle" / "0000.png", source / "train" / "circle" / "copy-of-test.png")
    shutil.copyfile(source / "train" / "square" / "0001.png", source / "train" / "square" / "again.png")
    result = _validate(source, cache)
    found = {p.path: p.reason for p in result.report.duplicates}
    assert (
        "same content as test image test/circle/0000.png: kept out of training"
        in found["train/circle/copy-of-test.png"]
    )
    assert found["train/square/again.png"] == "same content as train/square/0001.png (train): kept once"
    kept = {e.path for e in result.snapshot.entries}
    assert "train/circle/copy-of-test.png" not in kept and "test/circle/0000.png" in kept
    assert "train/square/0001.png" in kept and "train/square/again.png" not in kept
    train_hashes = {e.sha256 for e in result.snapshot.split("train")}
    assert not train_hashes & {e.sha256 for e in result.snapshot.split("test")}


def test_the_spec_follows_the_data(tmp_path):
    gray = tmp_path / "gray"
    write_shapes(gray, per_class=6, size=20, rgb=False)
    (gray / "circle" / "big.png").write_bytes(png_bytes(shape_image("circle", 77, 40, rgb=False)))
    result = _validate(gray, tmp_path / "cache")
    assert (result.spec.channels, result.spec.height, result.spec.width) == (1, 20, 20)  # the most common size
    assert _validate(gray, tmp_path / "cache", image_size=24).spec.height == 24
    (gray / "square" / "color.png").write_bytes(png_bytes(shape_image("square", 78, 20, rgb=True)))
    assert _validate(gray, tmp_path / "cache").spec.channels == 3  # one color image makes the model RGB
