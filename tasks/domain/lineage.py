"""Where a model came from: the data set's identity as an MLflow input, and the run's source tags. Runs on the driver.

``source_tags`` are the tags ``mlflow.start_run`` would set (git commit, user, entry point),
which runs created through ``MlflowClient`` (as trainlib's ``MLflowLogger`` does) lack;
``log_dataset_input`` records the data set with ``name``, md5 ``digest`` and ``source`` so the
MLflow UI shows which data trained a run.

Example::

    tags = source_tags("flows.pipeline:training-pipeline")
    log_dataset_input(run_id, dataset_identity(staged), tracking_uri)
"""

from __future__ import annotations

import getpass
import os
import subprocess
from typing import TYPE_CHECKING

from tasks.domain.staging import StagedDataset
from tasks.domain.urls import mask_url

if TYPE_CHECKING:  # model_card imports torch: a run that skips needs none
    from tasks.domain.model_card import DatasetIdentity

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# MLflow's reserved source tags (mlflow.utils.mlflow_tags; a test checks they still are). Spelled out here because
# the flow process sets them before any step and needs nothing else of mlflow, whose import costs ~1-1.5 s of CPU.
SOURCE_NAME_TAG, SOURCE_TYPE_TAG = "mlflow.source.name", "mlflow.source.type"
USER_TAG, GIT_COMMIT_TAG = "mlflow.user", "mlflow.source.git.commit"


def git_commit(folder: str = REPO_ROOT) -> str | None:
    """The commit checked out in ``folder`` (None outside a git checkout or without git)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def source_tags(entry_point: str) -> dict[str, str]:
    """MLflow's standard source tags for a run started by ``entry_point`` (e.g. ``flows.pipeline:training-pipeline``)."""
    tags = {SOURCE_NAME_TAG: entry_point, SOURCE_TYPE_TAG: "JOB"}
    try:
        tags[USER_TAG] = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (e.g. in some containers)
        pass
    commit = git_commit()
    if commit:
        tags[GIT_COMMIT_TAG] = commit
    return tags


def dataset_identity(dataset: StagedDataset) -> DatasetIdentity:
    """The identity of a staged data set: its name, file md5s, and where it came from (masked)."""
    sources = sorted(set(dataset.sources.values()))
    source = sources[0].rsplit("/", 1)[0] + "/" if sources else dataset.staged_url
    from tasks.domain.model_card import DatasetIdentity

    return DatasetIdentity(name=dataset.name, md5s=dict(dataset.md5s), source=mask_url(source))


def log_dataset_input(run_id: str, identity: DatasetIdentity, tracking_uri: str, context: str = "training") -> None:
    """Record the data set as an input of MLflow run ``run_id`` (name, md5 digest, source URL)."""
    import json

    from mlflow import MlflowClient
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    dataset = Dataset(
        name=identity.name,
        digest=identity.digest,
        source_type="url" if "://" in identity.source else "local",
        source=json.dumps({"url": identity.source}),
        profile=json.dumps({"files": dict(identity.md5s)}),
    )
    MlflowClient(tracking_uri=tracking_uri).log_inputs(
        run_id, datasets=[DatasetInput(dataset, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])]
    )
