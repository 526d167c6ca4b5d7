"""The pipeline's home: the one place that defines where its state lives by default. Runs anywhere.

Every entry point (``python -m flows.main``, a worker running the ``prefect.yaml``
deployment, a direct call of the flow) resolves the same locations, so a manual run and a
scheduled run share one MLflow registry, one run storage and one data cache:

=========================  ==============================  ==============================
what                       default                         override (environment)
=========================  ==============================  ==============================
home folder                ``~/.trainlib``                 ``TRAINLIB_HOME``
run storage                ``<home>/runs``                 ``TRAINLIB_STORAGE_PATH`` (e.g. ``s3://...``)
data cache (per node)      ``<home>/datasets``             ``TRAINLIB_DATA_CACHE``
MLflow tracking / registry ``sqlite:///<home>/mlflow.db``  ``MLFLOW_TRACKING_URI`` (e.g. ``http://mlflow:5000``)
MLflow artifacts (SQLite)  ``<home>/mlartifacts``          the server's ``--artifacts-destination``
embedded Prefect server    ``<home>/prefect``              ``PREFECT_API_URL`` (use a running server)
=========================  ==============================  ==============================

A flow parameter set explicitly wins over all of these.

Example::

    home = PipelineHome.resolve()
    home.storage_path, home.mlflow_tracking_uri
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from tasks.domain.urls import expand_path

HOME_ENV_VAR = "TRAINLIB_HOME"
STORAGE_ENV_VAR = "TRAINLIB_STORAGE_PATH"
DATA_CACHE_ENV_VAR = "TRAINLIB_DATA_CACHE"
MLFLOW_ENV_VAR = "MLFLOW_TRACKING_URI"
DEFAULT_HOME = "~/.trainlib"


@dataclasses.dataclass(frozen=True)
class PipelineHome:
    """Where one pipeline installation keeps its state (see the module docstring for the table).

    Attributes:
        root: the home folder (absolute).
        storage_path: trainlib's run storage (a folder or an fsspec URL).
        data_cache: each node's verified copy of the data sets (a local folder).
        mlflow_tracking_uri: MLflow's tracking store and model registry.
    """

    root: str
    storage_path: str
    data_cache: str
    mlflow_tracking_uri: str

    @property
    def prefect_home(self) -> str:
        """``PREFECT_HOME`` of the embedded Prefect server (its SQLite database)."""
        return os.path.join(self.root, "prefect")

    @property
    def mlflow_artifacts(self) -> str | None:
        """Where a SQLite store keeps its artifacts (``<db folder>/mlartifacts``); None for a server."""
        prefix = "sqlite:///"
        if not self.mlflow_tracking_uri.startswith(prefix):
            return None
        return os.path.join(os.path.dirname(self.mlflow_tracking_uri[len(prefix) :]), "mlartifacts")

    @classmethod
    def resolve(cls, root: str | None = None, environ: Mapping[str, str] | None = None) -> PipelineHome:
        """The home from ``root`` (else ``TRAINLIB_HOME``, else ``~/.trainlib``) and the environment's overrides."""
        env = os.environ if environ is None else environ
        home = expand_path(root or env.get(HOME_ENV_VAR) or DEFAULT_HOME)
        return cls(
            root=home,
            storage_path=expand_path(env.get(STORAGE_ENV_VAR) or os.path.join(home, "runs")),
            data_cache=expand_path(env.get(DATA_CACHE_ENV_VAR) or os.path.join(home, "datasets")),
            mlflow_tracking_uri=env.get(MLFLOW_ENV_VAR) or f"sqlite:///{os.path.join(home, 'mlflow.db')}",
        )
