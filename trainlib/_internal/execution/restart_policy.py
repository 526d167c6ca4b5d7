"""Whether the worker group restarts after a failed attempt: the failure and preemption budgets. Driver only.

``FailureConfig.max_failures`` bounds the restarts after ordinary failures; ``max_preemption_failures`` those
after a failure that a draining node caused (its own budget, unless it is 0: then preemptions count as failures).
"""

from __future__ import annotations

import dataclasses

from trainlib.config import FailureConfig
from trainlib.errors import WorkerError, WorkerGroupError


@dataclasses.dataclass(frozen=True)
class FailurePolicy:
    """Decides, after each failure, whether the group restarts."""

    max_failures: int

    def should_restart(self, failures_so_far: int) -> bool:
        return self.max_failures < 0 or failures_so_far <= self.max_failures


class RestartPolicy:
    """Counts each failed attempt against its budget; says when the run must fail instead of restarting."""

    def __init__(self, failure_config: FailureConfig):
        self.policy = FailurePolicy(failure_config.max_failures)
        self.preemption_policy = FailurePolicy(failure_config.max_preemption_failures)
        self.failures: list[WorkerError] = []  # the failed attempts counted against max_failures, oldest first
        self.preemptions: list[WorkerError] = []  # those counted against max_preemption_failures

    def count(self, failure: WorkerError, preempted: bool, last_failures: list[WorkerError]) -> WorkerGroupError | None:
        """Count ``failure`` (a draining node caused it when ``preempted``) against its budget.

        Returns:
            None when the group restarts, else the error that ends the run, with every rank's failure of the
            last failed attempt (``last_failures``; ``failure`` alone when there are none).
        """
        counted = self.preemptions if preempted and self.preemption_policy.max_failures != 0 else self.failures
        counted.append(failure)
        policy = self.preemption_policy if counted is self.preemptions else self.policy
        if policy.should_restart(len(counted)):
            return None
        return WorkerGroupError(
            counted, policy.max_failures, {f.rank: f.__cause__ or f for f in last_failures or [failure]}
        )

    def restarts_text(self) -> str:
        """The restart about to happen, as the log names it: ``2`` or ``2 of 3``."""
        limit = self.policy.max_failures
        return f"{len(self.failures)}" + ("" if limit < 0 else f" of {limit}")
