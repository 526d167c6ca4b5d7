"""Prefect tasks for a user's data: take the run's snapshot, then validate it. Run on Ray workers in the pipeline.

``snapshot-data`` lists the source and hashes its files (a hash cache makes re-listing cheap),
unless this training run already has its snapshot in run storage: a retried or re-run run then
reads its own, so files that arrived later never reach it. ``validate-data`` decodes each new
file once, leaves unusable files and training copies of test images out, compares classes and
counts with the champion's snapshot, writes the validated snapshot to run storage and leaves the
report as Prefect artifacts (a table per class, a markdown summary naming every file left out).
Bad input fails here, before any training, with the domain code's message.
"""

from __future__ import annotations

import dataclasses

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from tasks.artifacts import artifact_key
from tasks.domain.cpu_threads import use_assigned_cpus
from tasks.domain.data_source import open_fs
from tasks.domain.data_validation import FactsCache, ValidationSettings, validate_snapshot
from tasks.domain.data_version import DataVersion, champion_snapshot
from tasks.domain.snapshot import Snapshot, read_snapshot, take_snapshot, write_snapshot
from tasks.domain.snapshot_files import SnapshotReader
from tasks.domain.urls import mask_url
from tasks.domain.validation_report import ValidationReport

DATA_TIMEOUT_S = 60 * 60


@dataclasses.dataclass(frozen=True)
class TakenSnapshot:
    """The snapshot-data step's result: the snapshot, and whether it is this run's, read back from run storage."""

    snapshot: Snapshot
    reused: bool


@dataclasses.dataclass(frozen=True)
class PreparedData:
    """The validate-data step's result: the data version to train on and the validation report."""

    version: DataVersion
    report: ValidationReport


def _exists(url: str) -> bool:
    fs, path = open_fs(url)
    fs.invalidate_cache()
    return fs.exists(path)


@task(name="snapshot-data", cache_policy=NO_CACHE, timeout_seconds=DATA_TIMEOUT_S)
def snapshot_data(data: str, cache_dir: str, snapshot_uri: str) -> TakenSnapshot:
    """This run's snapshot of ``data``: read back from ``snapshot_uri`` when the run has one, else taken now."""
    logger = get_run_logger()
    if _exists(snapshot_uri):
        snapshot = read_snapshot(snapshot_uri)
        logger.info(
            "Using this run's snapshot %s (digest %s, %d files); files that arrived since are not in it",
            mask_url(snapshot_uri),
            snapshot.digest[:12],
            len(snapshot.entries),
        )
        return TakenSnapshot(snapshot, reused=True)
    snapshot = take_snapshot(data, cache_dir=cache_dir)
    logger.info(
        "Snapshot of %s: %d files in %d classes, digest %s",
        mask_url(data),
        len(snapshot.entries),
        len(snapshot.class_names),
        snapshot.digest[:12],
    )
    return TakenSnapshot(snapshot, reused=False)


@task(name="validate-data", cache_policy=NO_CACHE, timeout_seconds=DATA_TIMEOUT_S)
def validate_data(
    taken: TakenSnapshot,
    cache_dir: str,
    snapshot_uri: str,
    settings: ValidationSettings,
    model_name: str,
    tracking_uri: str,
) -> PreparedData:
    """Validate the snapshot, write the validated one to ``snapshot_uri``; report in the log and as artifacts."""
    logger = get_run_logger()
    use_assigned_cpus()
    snapshot = taken.snapshot
    champion = champion_snapshot(model_name, tracking_uri)
    validated = validate_snapshot(
        snapshot, SnapshotReader(snapshot, cache_dir), FactsCache(cache_dir), champion, settings
    )
    report = validated.report
    for problem in report.unusable:
        logger.warning("Left out %s (%s, %s): %s", problem.path, problem.label, problem.split, problem.reason)
    for problem in report.duplicates:
        logger.warning("Duplicate %s (%s, %s): %s", problem.path, problem.label, problem.split, problem.reason)
    if not taken.reused or validated.snapshot.digest != snapshot.digest:
        write_snapshot(validated.snapshot, snapshot_uri)
    version = DataVersion.of(validated.snapshot, snapshot_uri, validated.spec)
    logger.info(
        "Data version %s: %d images (%d decoded now, %d left out, %d duplicates); %s",
        version.digest[:12],
        len(validated.snapshot.entries),
        report.decoded,
        len(report.unusable),
        len(report.duplicates),
        ", ".join(f"{label}: {c['train']} train / {c['test']} test" for label, c in version.counts.items()),
    )
    create_table_artifact(
        report.rows(),
        key=artifact_key("data-validation", model_name),
        description=f"Images per class and split of data version {version.digest[:12]}, and their change",
    )
    create_markdown_artifact(
        report.markdown() + f"\nSnapshot: `{mask_url(snapshot_uri)}`\n",
        key=artifact_key("data-validation-report", model_name),
        description="What the validation step found: files left out, duplicates, class changes",
    )
    return PreparedData(version=version, report=report)
