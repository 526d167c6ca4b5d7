"""MLflow tracking for trainlib runs: ``MLflowLogger``, ``log_model``, ``default_tracking_uri``. Driver only.

The underscored modules are internal; what they offer to users is re-exported here.

``MLflowLogger`` is a driver-side :class:`trainlib.Callback`: one MLflow run per
training job whatever its world size; a tracking outage never costs the
training (records are spooled locally and replayed). ``log_model`` logs a
checkpoint's weights as an MLflow model. Neither ``import trainlib`` nor this
package imports mlflow: a run's ``before_run`` does, and ``log_model`` and
``SpoolReplay`` on first use, so a process that only builds a logger or checks a
tracking URI (a pipeline's task process) does not pay ~1-1.5 s of CPU for it.

Example:
    >>> from trainlib.mlflow import MLflowLogger, log_model
    >>> logger = MLflowLogger(experiment_name="fashion-mnist")
    >>> result = TorchTrainer(train_func, run_config=trainlib.RunConfig(callbacks=[logger])).fit()
    >>> info = log_model(result.checkpoint, Net(), input_example=x[:4], registered_model_name="fashion")
"""

from typing import Any

from trainlib.mlflow._store import default_tracking_uri, probe_tracking_server, using_tracking_uri
from trainlib.mlflow.errors import TrackingError
from trainlib.mlflow.logger import MLflowLogger

# The names whose modules import mlflow, imported when first used (PEP 562).
_IMPORTS_MLFLOW = {"SpoolReplay": "trainlib.mlflow._spool", "log_model": "trainlib.mlflow.model"}

__all__ = [
    "MLflowLogger",
    "SpoolReplay",
    "TrackingError",
    "default_tracking_uri",
    "log_model",
    "probe_tracking_server",
    "using_tracking_uri",
]


def __getattr__(name: str) -> Any:
    if name in _IMPORTS_MLFLOW:
        import importlib

        value = getattr(importlib.import_module(_IMPORTS_MLFLOW[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trainlib.mlflow' has no attribute {name!r}")
