"""The worker group of one attempt as the controller sees it, and how an attempt ends to grow. Driver only.

``RayWorkerGroup`` implements it on Ray actors, ``local_mode.LocalWorkerGroup`` in the calling thread, and
tests swap in fakes to test the controller's failure logic without a cluster.
"""

from __future__ import annotations

from typing import Protocol

from trainlib._internal.execution.messages import WorkerMessage
from trainlib._internal.execution.placement import RankPlan
from trainlib._internal.execution.spec import AttemptSpec, Placement


class WorkerGroup(Protocol):
    """The workers of one attempt, as the controller sees them (``RayWorkerGroup``, or a fake in tests)."""

    def start_actors(self) -> None: ...
    def placements(self) -> list[Placement]: ...
    def start(self, attempt: AttemptSpec) -> RankPlan | None: ...
    def wait(self, timeout: float | None = None) -> list[WorkerMessage]: ...
    def flush(self, timeout: float) -> list[WorkerMessage]: ...
    def shutdown(self) -> None: ...


class Resize:
    """How an attempt ends when the group should restart bigger (an elastic run that found room)."""


RESIZE = Resize()
