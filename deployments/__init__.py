"""Deployments of the pipeline. The deployment itself is declared in ``prefect.yaml`` at the
repository root (``prefect --no-prompt deploy --all`` reads it); these names match it.

Nothing here runs at import time. The names are defined here only: the flows (``@flow(name=...)``), the
alerts, scripts and tests import them.
"""

FLOW_NAME = "training-pipeline"
DEPLOYMENT_NAME = "fashion-mnist-retrain"
WORK_POOL = "trainlib-process"
SCHEDULE_CRON = "0 3 * * 1"
SCHEDULE_TIMEZONE = "Europe/Berlin"
SCORE_FLOW_NAME = "score-images"
SCORE_DEPLOYMENT_NAME = "score-images"

__all__ = [
    "DEPLOYMENT_NAME",
    "FLOW_NAME",
    "SCHEDULE_CRON",
    "SCHEDULE_TIMEZONE",
    "SCORE_DEPLOYMENT_NAME",
    "SCORE_FLOW_NAME",
    "WORK_POOL",
]
