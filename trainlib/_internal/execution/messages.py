"""Messages a worker sends to the driver, in order: reports, then done or failed. Built in workers, read on the driver."""

from __future__ import annotations

import dataclasses
import traceback

# Messages a worker sends to the driver, in order.
REPORT = "report"
DONE = "done"
ERROR = "error"


@dataclasses.dataclass(frozen=True)
class CheckpointPlacement:
    """Where a rank's checkpoint files of one report went (the last field of a REPORT message)."""

    dir_name: str  # the checkpoint's folder in the run folder
    in_place: bool = False  # written there by the user (NO_UPLOAD, checkpoint_upload_fn): list it at commit


def error_message(rank: int, exc: BaseException) -> tuple:
    """The ERROR message for ``exc``: its text, traceback and (if picklable) the exception itself."""
    import cloudpickle

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        payload = cloudpickle.dumps(exc)
    except Exception:  # noqa: BLE001 - unpicklable exceptions travel as text only
        payload = None
    return (ERROR, rank, f"{type(exc).__name__}: {exc}", text, payload)
