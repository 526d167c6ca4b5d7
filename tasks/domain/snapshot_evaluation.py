"""The evaluate step on a snapshot: the new checkpoint and the champion scored on the snapshot's test split.

Runs on the driver (the evaluate task's process). The test split is read as training read its
images (hash-checked, the node's cache, decoded and resized to the run's ImageSpec); its identity,
recorded on the version like the idx sets' md5s, is the sha256 of the test images' hashes. A
champion trained on other classes (another snapshot's, or an idx set's) is not scored on these
labels: it gets an error saying so, and the challenger is compared with nothing.

Example::

    comparison = compare_on_snapshot(training, version, "/cache", None, "pets-resnet18", tracking_uri)
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from tasks.domain.champion_comparison import Comparison, checkpoint_network, probe_digest, score_champion
from tasks.domain.data_version import DataVersion, champion_snapshot
from tasks.domain.evaluation import evaluate_model
from tasks.domain.gates import SliceScore
from tasks.domain.promotion import ChampionScore
from tasks.domain.snapshot import Snapshot, SnapshotEntry, read_snapshot
from tasks.domain.snapshot_files import SnapshotReader
from tasks.domain.snapshot_loading import decode_entries
from tasks.domain.training_run import TrainingOutcome


def test_split_identity(snapshot: Snapshot, limit: int | None = None) -> str:
    """``snapshot-test:<sha256>`` of the (first ``limit``) test images' content hashes, in path order."""
    entries = sorted(snapshot.split("test"), key=lambda e: e.path)[:limit]
    return "snapshot-test:" + hashlib.sha256("\n".join(e.sha256 for e in entries).encode()).hexdigest()


def compare_on_snapshot(
    training: TrainingOutcome,
    version: DataVersion,
    cache_dir: str,
    test_limit: int | None,
    model_name: str,
    tracking_uri: str,
) -> Comparison:
    """Score the trained checkpoint, and the champion when it knows the same classes, on the test split."""
    snapshot = read_snapshot(version.snapshot_uri)
    entries = sorted(snapshot.split("test"), key=lambda e: e.path)[:test_limit]
    images, labels = decode_entries(SnapshotReader(snapshot, cache_dir), entries, version.spec)
    network = checkpoint_network(training.checkpoint_uri, training.architecture, version.spec)
    report = evaluate_model(network, images, labels, version.spec.class_names)
    test_id = test_split_identity(snapshot, test_limit)
    champion_data = champion_snapshot(model_name, tracking_uri)
    from mlflow import MlflowClient

    from tasks.domain.champion import alias_version

    current = alias_version(MlflowClient(tracking_uri=tracking_uri), model_name)
    if current is None:
        champion = ChampionScore(version=None)
    elif champion_data is None or champion_data.class_names != version.spec.class_names:
        had = "no snapshot (trained on a built-in set)" if champion_data is None else list(champion_data.class_names)
        champion = ChampionScore(
            version=str(current.version), error=f"trained on other classes ({had}), so not comparable on these labels"
        )
    else:
        champion = score_champion(
            model_name, tracking_uri, images, labels, test_id, num_classes=len(version.spec.class_names)
        )
    return Comparison(
        report=report,
        champion=champion,
        test_data_md5=test_id,
        probe=probe_digest(network, images),
        newest_slice=newest_batch_slice(entries, network, images, labels, version.spec.class_names),
    )


def newest_batch_slice(
    entries: Sequence[SnapshotEntry], network: Any, images: Any, labels: Any, class_names: Sequence[str]
) -> SliceScore | None:
    """The network's accuracy on the test images of the newest batch (the last batch folder by name), if any.

    ``entries`` are the test entries ``images`` and ``labels`` were decoded from, in the same order.
    """
    batches = sorted({e.batch for e in entries if e.batch})
    if not batches:
        return None
    newest = batches[-1]
    mine = [i for i, e in enumerate(entries) if e.batch == newest]
    report = evaluate_model(network, images[mine], labels[mine], class_names)
    return SliceScore(name=newest, accuracy=report.accuracy, images=len(mine))
