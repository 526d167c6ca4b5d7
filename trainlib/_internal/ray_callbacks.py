"""Ray Train v2 callbacks (``ray.train.UserCallback`` subclasses, such as Ray Tune's
``ray.tune.integration.ray_train.TuneReportCallback``) in ``RunConfig.callbacks``: adapted to trainlib's driver-side
hooks. Driver only.

``after_report(run_context, metrics, checkpoint)`` gets trainlib's ``RunInfo`` as the run context and a one-item list
with rank 0's metrics (the driver holds rank 0's only); Tune's ``TuneReportCallback`` is served by reporting rank 0's
metrics, with ``checkpoint_path``, to the trial's session directly (``ray.tune.report``); ``after_exception(
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


def _is_tune_report_callback(callback: Any) -> bool:
    cls = type(callback)
    return cls.__name__ == "TuneReportCallback" and cls.__module__.startswith("ray.tune")


class RayUserCallback(Callback):
    """A Ray Train ``UserCallback`` called from trainlib's hooks."""

    def __init__(self, callback: Any):
        self.callback = callback

    def state_key(self) -> str:
        return f"ray.train.UserCallback:{type(self.callback).__name__}"

    def after_report(self, run: Any, report: Any) -> None:
        if _is_tune_report_callback(self.callback):
            # Tune's callback hands the metrics to the trial through a queue that Tune's own thread reads and
            # reports from (made for Ray Train's controller, another process); in the trial's process trainlib
            # reports them straight to the trial's session instead, as a function trainable does (a reliable
            # hand-over: the queue's path stalled a trial at its second report).
            import ray.tune

            metrics = dict(report.metrics)
            if report.checkpoint is not None:
                metrics["checkpoint_path"] = report.checkpoint.path  # as Tune's callback adds it
            ray.tune.report(metrics)
            return
        self.callback.after_report(run, [dict(report.metrics)], report.checkpoint)

    def after_failure(self, run: Any, failure: Any, will_restart: bool) -> None:
        self.callback.after_exception(run, {failure.rank: failure})

    def __repr__(self) -> str:
        return f"RayUserCallback({self.callback!r})"
