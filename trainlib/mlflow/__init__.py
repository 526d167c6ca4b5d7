"""MLflow tracking for trainlib runs: ``MLflowLogger``, ``log_model``, ``default_tracking_uri``. Driver only.

``MLflowLogger`` is a driver-side :class:`trainlib.Callback`: one MLflow run per
training job whatever its world size; a tracking outage never costs the
training (records are spooled locally and replayed). ``log_model`` logs a
checkpoint's weights as an MLflow model. ``import trainlib`` does not import
mlflow; this package does.

Example:
    >>> from trainlib.mlflow import MLflowLogger, log_model
    >>> logger = MLflowLogger(experiment_name="fashion-mnist")
    >>> result = TorchTrainer(train_func, run_config=trainlib.RunConfig(callbacks=[logger])).fit()
    >>> info = log_model(result.checkpoint, Net(), input_example=x[:4], registered_model_name="fashion")
"""

from trainlib.mlflow.errors import TrackingError
from trainlib.mlflow.logger import MLflowLogger
from trainlib.mlflow.model import log_model
from trainlib.mlflow.spool import SpoolReplay
from trainlib.mlflow.store import default_tracking_uri, using_tracking_uri

__all__ = ["MLflowLogger", "SpoolReplay", "TrackingError", "default_tracking_uri", "log_model", "using_tracking_uri"]
