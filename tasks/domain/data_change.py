"""What changed in a source since the champion's snapshot: the check that skips unchanged weeks. Runs in the flow.

A scheduled or triggered run lists its source (:func:`tasks.domain.snapshot.take_snapshot`, cheap on a
second listing thanks to the hash cache) and compares the content hashes with the champion's snapshot
before anything starts on Ray. Files known to be unusable (decoded before by the validation step on
this node: :class:`tasks.domain.data_validation.FactsCache`) are not new data: a corrupt file left in
the source does not make every later week train again. No Prefect here.

Example::

    change = data_change(take_snapshot(source, cache_dir=cache), champion_snapshot(name, uri), "3", cache)
    if change.nothing_new(min_new_images=1):
        print(change.message(1))  # "no new data since 1a2b3c4d5e6f (champion version 3): nothing trained ..."
"""

from __future__ import annotations

import dataclasses

from tasks.domain.snapshot import Snapshot


@dataclasses.dataclass(frozen=True)
class DataChange:
    """A snapshot against the champion's.

    Attributes:
        digest: this snapshot's digest.
        champion_version: the champion's version (None: no champion).
        champion_digest: the champion's snapshot's digest (None: no champion, or one trained without a snapshot).
        new_images: images whose content the champion's snapshot lacks, known-unusable files left out.
        images: every image of this snapshot.
        rerun: the run had its snapshot already (a retry or a re-run of the same run name): it goes on with
            what it started, never skipped.
    """

    digest: str
    champion_version: str | None
    champion_digest: str | None
    new_images: int
    images: int
    rerun: bool = False

    def nothing_new(self, min_new_images: int) -> bool:
        """Fewer than ``min_new_images`` new images since a champion's snapshot (never without one, nor for a
        re-run)."""
        return not self.rerun and self.champion_digest is not None and self.new_images < min_new_images

    def message(self, min_new_images: int) -> str:
        """The skipped run's sentence."""
        return (
            f"no new data since {self.champion_digest} (champion version {self.champion_version}): nothing trained "
            f"({self.new_images} new image(s) of {self.images}, min_new_images={min_new_images}; force=true trains "
            "anyway)"
        )


def data_change(
    snapshot: Snapshot, champion: Snapshot | None, champion_version: str | None, cache_dir: str | None = None
) -> DataChange:
    """Count ``snapshot``'s images that ``champion``'s snapshot lacks (``cache_dir``: the node's facts cache)."""
    if champion is None:
        return DataChange(snapshot.digest, champion_version, None, len(snapshot.entries), len(snapshot.entries))
    new = {e.sha256 for e in snapshot.entries} - champion.hashes
    if new and cache_dir:
        from tasks.domain.data_validation import FactsCache

        new -= {sha for sha, facts in FactsCache(cache_dir).get(new).items() if not facts.ok}
    count = sum(1 for e in snapshot.entries if e.sha256 in new)
    return DataChange(snapshot.digest, champion_version, champion.digest, count, len(snapshot.entries))


def source_change(
    source: str, cache_dir: str, model_name: str, tracking_uri: str, snapshot_uri: str
) -> tuple[Snapshot, DataChange]:
    """This run's snapshot against the champion's (in the registry at ``tracking_uri``).

    The snapshot is the one at ``snapshot_uri`` when this run has one already (a retry trains on what its
    first attempt listed, and is never skipped); else ``source`` is listed now and the snapshot written there
    for the run's steps.
    """
    from mlflow import MlflowClient

    from tasks.domain.champion import champion_version
    from tasks.domain.data_source import open_fs
    from tasks.domain.data_version import champion_snapshot
    from tasks.domain.snapshot import read_snapshot, take_snapshot, write_snapshot

    fs, path = open_fs(snapshot_uri)
    rerun = fs.exists(path)
    snapshot = read_snapshot(snapshot_uri) if rerun else take_snapshot(source, cache_dir=cache_dir)
    version = champion_version(MlflowClient(tracking_uri=tracking_uri), model_name)
    champion = champion_snapshot(model_name, tracking_uri) if version is not None else None
    change = dataclasses.replace(data_change(snapshot, champion, version, cache_dir), rerun=rerun)
    if not rerun:
        write_snapshot(snapshot, snapshot_uri)
    return snapshot, change
