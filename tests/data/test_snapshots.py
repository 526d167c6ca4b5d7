"""Folder and manifest sources, local and on S3 (moto), listed into snapshots; the hash cache; bad input.

No Ray here: listing, hashing and snapshots run on the driver. moto's S3 server runs in-process.
"""

from __future__ import annotations

import os
import shutil

import pandas as pd
import pytest
from data_helpers import moto_s3_env, write_shapes

from tasks.domain.data_source import DataSourceError, check_source, list_source
from tasks.domain.hash_cache import HashCache
from tasks.domain.snapshot import Snapshot, SnapshotEntry, read_snapshot, take_snapshot, write_snapshot

pytestmark = pytest.mark.integration

BUCKET = "trainlib-data-test"


def test_folder_snapshot_is_stable_when_relisted_and_changes_with_one_added_file(tmp_path):
    source, cache = tmp_path / "shapes", str(tmp_path / "cache")
    write_shapes(source, per_class=10, size=12)
    first = take_snapshot(str(source), cache_dir=cache)
    assert first.class_names == ("circle", "square", "stripe")
    assert sum(c["train"] + c["test"] for c in first.counts().values()) == 30
    assert all(e.split in ("train", "test") and len(e.sha256) == 64 and e.size > 0 for e in first.entries)
    assert first.split("test"), "a source without splits gets a test split by content hash"

    again = take_snapshot(str(source), cache_dir=cache)
    assert again.digest == first.digest and again == first

    write_shapes(source, per_class=1, size=12, start=100)  # one new image per class
    (source / "square" / "0100.png").unlink()
    (source / "stripe" / "0100.png").unlink()
    grown = take_snapshot(str(source), cache_dir=cache)
    assert grown.digest != first.digest
    assert len(grown.entries) == 31 and grown.hashes > first.hashes


def test_relisting_reads_only_changed_files_through_the_hash_cache(tmp_path):
    source, cache = tmp_path / "shapes", str(tmp_path / "cache")
    write_shapes(source, per_class=5, size=12)
    take_snapshot(str(source), cache_dir=cache)
    listing = list_source(str(source))
    hashes = HashCache(cache)
    from tasks.domain.data_source import open_fs
    from tasks.domain.hash_cache import FileToHash

    fs, _ = open_fs(str(source))
    files = [FileToHash(listing.url(f.path), listing.url(f.path), f.size, f.version) for f in listing.files]
    hashes.hash_files(lambda f: fs.cat_file(f.path), files)
    assert (hashes.stats.cached, hashes.stats.hashed) == (15, 0)

    rewritten = source / "circle" / "0000.png"
    shutil.copyfile(source / "circle" / "0001.png", rewritten)  # new content, new mtime
    os.utime(rewritten, (1, 1))
    listing = list_source(str(source))
    files = [FileToHash(listing.url(f.path), listing.url(f.path), f.size, f.version) for f in listing.files]
    got = hashes.hash_files(lambda f: fs.cat_file(f.path), files)
    assert (hashes.stats.cached, hashes.stats.hashed) == (14, 1)
    assert got[str(rewritten)] == got[str(source / "circle" / "0001.png")]


def test_layouts_splits_and_batches(tmp_path):
    split_root = tmp_path / "split"
    write_shapes(split_root, per_class=10, size=12, splits=True)
    snap = take_snapshot(str(split_root), cache_dir=str(tmp_path / "c"))
    assert snap.counts()["circle"] == {"train": 8, "test": 2}
    assert {e.batch for e in snap.entries} == {""}

    batches = tmp_path / "arrivals"
    write_shapes(batches / "2026-12-01", per_class=4, size=12)
    write_shapes(batches / "2026-12-08", per_class=4, size=12, start=50)
    snap = take_snapshot(str(batches), cache_dir=str(tmp_path / "c"))
    assert {e.batch for e in snap.entries} == {"2026-12-01", "2026-12-08"}
    assert snap.class_names == ("circle", "square", "stripe")
    assert next(e for e in snap.entries if e.batch == "2026-12-08").path.startswith("2026-12-08/")


def test_snapshot_parquet_round_trip_keeps_every_column(tmp_path):
    entries = (
        SnapshotEntry("b/2.png", "b", "test", "f" * 64, 20, "x"),
        SnapshotEntry("a/1.png", "a", "train", "e" * 64, 10, ""),
    )
    snap = Snapshot(source="/data/src", entries=entries)
    url = write_snapshot(snap, str(tmp_path / "runs" / "snapshots" / "r.parquet"))
    back = read_snapshot(url)
    assert back == snap and back.digest == snap.digest and back.root == "/data/src"
    assert list(pd.read_parquet(url).columns) == ["path", "label", "split", "batch", "sha256", "size"]
    reordered = Snapshot(source="/elsewhere", entries=entries[::-1])
    assert reordered.digest == snap.digest  # the digest is of the sorted rows, not the listing order
    assert snap.counts() == {"a": {"train": 1, "test": 0}, "b": {"train": 0, "test": 1}}
    assert snap.hashes == frozenset({"e" * 64, "f" * 64})


def test_manifest_csv_and_parquet_with_relative_paths_and_splits(tmp_path):
    root = tmp_path / "pets"
    paths = write_shapes(root / "images", per_class=4, size=12)
    rows = [
        {
            "path": os.path.relpath(p, root),
            "label": os.path.basename(os.path.dirname(p)),
            "split": ["train", "test"][i % 2],
        }
        for i, p in enumerate(paths)
    ]
    pd.DataFrame(rows).to_csv(root / "manifest.csv", index=False)
    pd.DataFrame(rows).drop(columns="split").to_parquet(root / "manifest.parquet")
    csv = take_snapshot(str(root / "manifest.csv"), cache_dir=str(tmp_path / "c"))
    assert len(csv.entries) == 12 and csv.counts()["circle"] == {"train": 2, "test": 2}
    assert csv.root == str(root) and os.path.isfile(csv.url(csv.entries[0]))
    parquet = take_snapshot(str(root / "manifest.parquet"), cache_dir=str(tmp_path / "c"))
    assert parquet.hashes == csv.hashes  # splits by content hash instead


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda root: root / "missing", ["data=", "does not exist", "Fix:"]),
        (lambda root: (root / "src" / "empty").mkdir(parents=True) or root / "src", ["class folder 'empty' is empty"]),
        (
            lambda root: _manifest(root, pd.DataFrame({"file": ["circle/0000.png"], "label": ["circle"]})),
            ["lacks column(s) path", "Fix: columns path,label"],
        ),
        (
            lambda root: _manifest(root, pd.DataFrame({"path": ["../secret.png", "a.png"], "label": ["a", "b"]})),
            ["'../secret.png' is outside the manifest's folder", "Fix:"],
        ),
        (lambda root: _one_class(root), ["1 class folder(s)", "at least two"]),
    ],
    ids=["missing", "empty-class-folder", "manifest-missing-column", "path-outside-root", "one-class"],
)
def test_bad_sources_name_the_parameter_the_path_and_the_fix(tmp_path, make, expected):
    write_shapes(tmp_path / "src", per_class=2, size=12)
    source = make(tmp_path)
    with pytest.raises(DataSourceError) as info:
        take_snapshot(str(source), cache_dir=str(tmp_path / "c"))
    for word in expected:
        assert word in str(info.value), str(info.value)
    assert str(source) in str(info.value)


def _manifest(root, frame):
    frame.to_csv(root / "src" / "manifest.csv", index=False)
    return root / "src" / "manifest.csv"


def _one_class(root):
    shutil.rmtree(root / "src" / "square")
    shutil.rmtree(root / "src" / "stripe")
    return root / "src"


def test_folder_and_manifest_on_s3_are_listed_hashed_cached_and_read_back(tmp_path, caplog, monkeypatch):
    import s3fs

    with moto_s3_env(BUCKET):
        local = tmp_path / "shapes"
        paths = write_shapes(local, per_class=5, size=12)
        fs = s3fs.S3FileSystem()
        fs.put(str(local) + "/", f"{BUCKET}/shapes/", recursive=True)
        frame = pd.DataFrame(
            {"path": [os.path.relpath(p, local) for p in paths], "label": [p.split(os.sep)[-2] for p in paths]}
        )
        with fs.open(f"{BUCKET}/shapes/manifest.csv", "wb") as f:
            f.write(frame.to_csv(index=False).encode())

        cache = str(tmp_path / "cache")
        folder = take_snapshot(f"s3://{BUCKET}/shapes", cache_dir=cache)
        local_snap = take_snapshot(str(local), cache_dir=str(tmp_path / "cache-local"))
        assert folder.digest == local_snap.digest  # same paths, labels and content: same data version
        blobs = [os.path.join(cache, "blobs", e.sha256[:2], e.sha256) for e in folder.entries]
        assert all(os.path.isfile(b) for b in blobs), "the files read for hashing stay in the node's cache"
        caplog.clear()
        with caplog.at_level("INFO", logger="trainlib"):
            assert take_snapshot(f"s3://{BUCKET}/shapes", cache_dir=cache).digest == folder.digest
        assert "Hashed 0 file(s); 15 came from the hash cache" in caplog.text  # by ETag, nothing fetched

        manifest = take_snapshot(f"s3://{BUCKET}/shapes/manifest.csv", cache_dir=cache)
        assert manifest.hashes == folder.hashes and manifest.url(manifest.entries[0]).startswith(f"s3://{BUCKET}/")
        urls = frame.assign(path=[f"s3://{BUCKET}/shapes/{p}" for p in frame["path"]])
        urls.to_csv(tmp_path / "urls.csv", index=False)  # a local manifest naming S3 objects by URL
        by_url = take_snapshot(str(tmp_path / "urls.csv"), cache_dir=str(tmp_path / "fresh-cache"))
        assert by_url.hashes == folder.hashes and by_url.url(by_url.entries[0]) == by_url.entries[0].path

        split_local = tmp_path / "split"
        write_shapes(split_local, per_class=3, size=12, splits=True)
        fs.put(str(split_local) + "/", f"{BUCKET}/split/", recursive=True)
        split = take_snapshot(f"s3://{BUCKET}/split", cache_dir=cache)  # s3fs lists the root as a folder too
        assert split.digest == take_snapshot(str(split_local), cache_dir=str(tmp_path / "cache-local")).digest
        assert split.counts()["circle"] == {"train": 2, "test": 1}

        url = write_snapshot(folder, f"s3://{BUCKET}/runs/snapshots/run-1.parquet")
        assert read_snapshot(url) == folder

        with pytest.raises(DataSourceError, match="does not exist"):
            check_source(f"s3://{BUCKET}/no-such-prefix")
        with monkeypatch.context() as env:  # undone before the moto environment is restored
            for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                env.delenv(key)
            for key in ("AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE"):
                env.setenv(key, "/nonexistent")
            env.setenv("AWS_EC2_METADATA_DISABLED", "true")
            s3fs.S3FileSystem.clear_instance_cache()
            with pytest.raises(DataSourceError) as info:
                check_source(f"s3://{BUCKET}/shapes")
        assert f"data='s3://{BUCKET}/shapes' cannot be read: no usable credentials" in str(info.value)
        assert "Fix: set AWS_ACCESS_KEY_ID" in str(info.value)
