"""A run's data version: where its snapshot is, its digest and ImageSpec, and how MLflow records them. Runs on the driver.

The snapshot of a run lives at ``<storage>/snapshots/<training run name>.parquet``; the run name is
stable across retries, so a retried or re-run run reads its own snapshot instead of listing the
source again. The registered version carries :data:`DIGEST_TAG` and :data:`SNAPSHOT_TAG`; the
champion's snapshot (for the validation step's class and count comparison) is read through them.

Example::

    version = DataVersion.of(snapshot, uri, spec)
    log_snapshot_input(run_id, snapshot, version, tracking_uri)
    champion = champion_snapshot("pets-resnet18", tracking_uri)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import posixpath
from typing import TYPE_CHECKING

from tasks.domain.image_spec import ImageSpec
from tasks.domain.snapshot import Snapshot, read_snapshot
from tasks.domain.urls import join_url, mask_url
from tasks.domain.validation_report import ValidationReport

if TYPE_CHECKING:  # model_card imports torch: a run that skips needs none
    from tasks.domain.model_card import DatasetIdentity

logger = logging.getLogger("trainlib")

DIGEST_TAG = "data.digest"
SNAPSHOT_TAG = "data.snapshot_uri"
SNAPSHOT_FOLDER = "snapshots"


def snapshot_location(storage_path: str, run_name: str) -> str:
    """Where training run ``run_name``'s snapshot is kept in run storage."""
    return join_url(join_url(storage_path, SNAPSHOT_FOLDER), f"{run_name}.parquet")


@dataclasses.dataclass(frozen=True)
class DataVersion:
    """The validated snapshot a run trains on, as the later steps need it.

    Attributes:
        source: the source as given (credentials masked).
        snapshot_uri: where the snapshot is (run storage).
        digest: the snapshot's digest: the data version.
        spec: channels, size and class names derived from the data.
        counts: label -> split -> images.
    """

    source: str
    snapshot_uri: str
    digest: str
    spec: ImageSpec
    counts: dict[str, dict[str, int]]

    @classmethod
    def of(cls, snapshot: Snapshot, snapshot_uri: str, spec: ImageSpec) -> DataVersion:
        return cls(mask_url(snapshot.source), snapshot_uri, snapshot.digest, spec, snapshot.counts())

    @property
    def name(self) -> str:
        """A short name for the data: the source's last path part."""
        return posixpath.basename(self.source.rstrip("/")) or self.source

    def tags(self) -> dict[str, str]:
        """The model version's data tags."""
        return {DIGEST_TAG: self.digest, SNAPSHOT_TAG: self.snapshot_uri}

    def identity(self) -> DatasetIdentity:
        """The model card's data identity (the snapshot's digest as its one checksum)."""
        from tasks.domain.model_card import DatasetIdentity

        return DatasetIdentity(name=self.name, md5s={"snapshot": self.digest}, source=self.source)


def log_snapshot_input(run_id: str, snapshot: Snapshot, version: DataVersion, tracking_uri: str) -> None:
    """Record the snapshot as MLflow run ``run_id``'s training input: source, digest, counts per class and split."""
    import mlflow
    import pandas as pd
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    from trainlib.mlflow import using_tracking_uri

    counts = pd.DataFrame(
        [{"class": label, **per_split} for label, per_split in version.counts.items()],
        columns=["class", "train", "test"],
    )
    frame = snapshot.frame()
    dataset = mlflow.data.from_pandas(frame, source=version.source, name=version.name, digest=version.digest[:32])
    entity = dataset._to_mlflow_entity()
    profile = {**json.loads(entity.profile or "{}"), "counts": version.counts}
    entity = Dataset(entity.name, entity.digest, entity.source_type, entity.source, entity.schema, json.dumps(profile))
    with using_tracking_uri(tracking_uri):
        client = mlflow.MlflowClient(tracking_uri=tracking_uri)
        client.log_inputs(run_id, datasets=[DatasetInput(entity, tags=[InputTag(MLFLOW_DATASET_CONTEXT, "training")])])
        client.log_table(run_id, counts, "data/counts.json")
        client.set_tag(run_id, DIGEST_TAG, version.digest)
        client.set_tag(run_id, SNAPSHOT_TAG, version.snapshot_uri)


def log_validation_report(run_id: str, report: ValidationReport, tracking_uri: str) -> None:
    """The validation report in MLflow run ``run_id``: ``data/validation.md`` and the per-class and problem tables."""
    import mlflow
    import pandas as pd

    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    client.log_text(run_id, report.markdown(), "data/validation.md")
    client.log_table(run_id, pd.DataFrame(report.rows()), "data/validation_classes.json")
    if report.problem_rows():
        client.log_table(run_id, pd.DataFrame(report.problem_rows()), "data/validation_problems.json")


def champion_snapshot(model_name: str, tracking_uri: str) -> Snapshot | None:
    """The champion version's snapshot (None: no champion, or one trained before snapshots, or unreadable)."""
    from mlflow import MlflowClient

    from tasks.domain.champion import alias_version

    version = alias_version(MlflowClient(tracking_uri=tracking_uri), model_name)
    uri = (version.tags or {}).get(SNAPSHOT_TAG) if version is not None else None
    if not uri:
        return None
    try:
        return read_snapshot(uri)
    except Exception as exc:  # noqa: BLE001 - the comparison is skipped, and the log says why
        logger.warning("The champion's snapshot %s cannot be read (%s): no comparison with it.", mask_url(uri), exc)
        return None
