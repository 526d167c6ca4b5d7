"""Ray Train v2 callbacks (``ray.train.UserCallback`` subclasses, such as Ray Tune's
``ray.tune.integration.ray_train.TuneReportCallback``) in ``RunConfig.callbacks``: adapted to trainlib's driver-side
hooks. Driver only.

``after_report(run_context, metrics, checkpoint)`` gets trainlib's ``RunInfo`` as the run context and a one-item list
with rank 0's metrics (the driver holds rank 0's only; Ray Tune's callback reads that item); ``after_exception(
run_context, worker_exceptions)`` gets the failed rank and its error after each failed attempt.
"""

from __future__ import annotations

from typing import Any

from trainlib.callbacks import Callback


def is_ray_user_callback(callback: Any) -> bool:
    """Whether ``callback`` is a Ray Train v2 ``UserCallback`` (checked by name: Ray Train need not be installed)."""
    return any(
        cls.__name__ == "UserCallback" and cls.__module__.startswith("ray.train") for cls in type(callback).__mro__
    )


class RayUserCallback(Callback):
    """A Ray Train ``UserCallback`` called from trainlib's hooks."""

    def __init__(self, callback: Any):
        self.callback = callback

    def state_key(self) -> str:
        return f"ray.train.UserCallback:{type(self.callback).__name__}"

    def after_report(self, run: Any, report: Any) -> None:
        self.callback.after_report(run, [dict(report.metrics)], report.checkpoint)

    def after_failure(self, run: Any, failure: Any, will_restart: bool) -> None:
        self.callback.after_exception(run, {failure.rank: failure})

    def __repr__(self) -> str:
        return f"RayUserCallback({self.callback!r})"
