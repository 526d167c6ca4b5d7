"""The Prefect events the pipeline emits, for automations to act on. Runs in the task processes.

=================================  ==================================  ===========================
event                              resource id                         payload
=================================  ==================================  ===========================
``trainlib.model.promoted``        ``mlflow.model.<name>``             version, test accuracy,
                                                                       previous champion, reason
``trainlib.training.failed``       ``trainlib.run.<run name>``         error type and message
``trainlib.data.arrived``          ``trainlib.data.<source>``          digest, images; the source
                                                                       also as ``trainlib.source``
=================================  ==================================  ===========================

Each event is related to the flow run and task run that emitted it (Prefect adds those), so
an automation can match on the flow's name or a deployment. Emitting never fails a task.
"""

from __future__ import annotations

import logging
from typing import Any

from prefect.events import emit_event

MODEL_PROMOTED = "trainlib.model.promoted"
TRAINING_FAILED = "trainlib.training.failed"
DATA_ARRIVED = "trainlib.data.arrived"
SOURCE_LABEL = "trainlib.source"  # the resource's label holding the source, which deployment triggers pass on

logger = logging.getLogger("trainlib")


def _emit(event: str, resource: dict[str, str], payload: dict[str, Any]) -> None:
    try:
        emit_event(event=event, resource=resource, payload=payload)
    except Exception as exc:  # noqa: BLE001 - an event is news, never a reason to fail the step
        logger.warning("Could not emit Prefect event %s: %s", event, exc)


def emit_model_promoted(
    model_name: str, version: str, test_accuracy: float, previous_champion: str | None, reason: str
) -> None:
    """Tell Prefect that ``version`` of ``model_name`` became the champion."""
    _emit(
        MODEL_PROMOTED,
        {"prefect.resource.id": f"mlflow.model.{model_name}", "prefect.resource.name": model_name},
        {
            "version": version,
            "test_accuracy": test_accuracy,
            "previous_champion": previous_champion or "none",
            "reason": reason,
        },
    )


def emit_training_failed(run_name: str, error: BaseException) -> None:
    """Tell Prefect that training run ``run_name`` failed with ``error``."""
    _emit(
        TRAINING_FAILED,
        {"prefect.resource.id": f"trainlib.run.{run_name}", "prefect.resource.name": run_name},
        {"error_type": type(error).__name__, "message": str(error)[:2000]},
    )


def emit_data_arrived(source: str, digest: str, images: int) -> None:
    """Tell Prefect that ``source`` (a URL without credentials) changed: its snapshot now has ``digest``."""
    _emit(
        DATA_ARRIVED,
        {"prefect.resource.id": f"trainlib.data.{source}", "prefect.resource.name": source, SOURCE_LABEL: source},
        {"digest": digest, "images": images},
    )
