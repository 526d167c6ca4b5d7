"""The run loop of one attempt: the ranks' messages until every rank is done or one fails. Driver only.

Each report goes to the committer (``report_committer.py``), which commits a step once every rank reported it.
After a failure the loop collects what the live ranks still had queued (their reports are not lost), and ends
the attempt with the failure's root cause. It also ends an attempt whose ranks outlive the first finished rank
by ``FailureConfig.straggler_timeout_s``, and, in an elastic run, one that should restart bigger.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from trainlib._internal import tunables
from trainlib._internal.execution.failures import ranks_text, root_cause, straggler_error, worker_error
from trainlib._internal.execution.group_protocol import RESIZE, Resize, WorkerGroup
from trainlib._internal.execution.messages import DoneMessage, FailedMessage, ReportMessage
from trainlib._internal.execution.monitor import PreemptionWatcher, ScalingPolicy, steps_without
from trainlib._internal.execution.placement import RankPlan
from trainlib._internal.execution.report_committer import ReportCommitter
from trainlib._internal.execution.return_value import unpickled_return_value
from trainlib.config import FailureConfig
from trainlib.errors import WorkerError

logger = logging.getLogger("trainlib")


class AttemptLoop:
    """Runs one started attempt of ``group`` to its end (``run``); rank 0's return value and the failures after."""

    def __init__(
        self,
        *,
        group: WorkerGroup,
        world_size: int,
        plan: RankPlan | None,
        node_ids: list[str],
        commits: ReportCommitter,
        failure_config: FailureConfig,
        scaling_policy: ScalingPolicy | None = None,
        watcher: PreemptionWatcher | None = None,
    ):
        self.group = group
        self.world_size = world_size
        self.plan = plan
        self.node_ids = node_ids  # each rank's node
        self.commits = commits
        self.failure_config = failure_config
        self.scaling_policy = scaling_policy  # elastic sizing and growth; None: a fixed group, no monitoring
        self.watcher = watcher
        self.done: set[int] = set()  # the ranks whose training function returned
        self.return_value: Any = None  # rank 0's, once 0 is in ``done``
        self.failures: list[WorkerError] = []  # every rank's failure, when the attempt failed

    def run(self) -> WorkerError | Resize | None:
        """Collect messages to the attempt's end: None when every rank finished, else why it ended."""
        world_size, done = self.world_size, self.done
        straggler_timeout_s = self.failure_config.straggler_timeout_s
        pending: dict[int, dict[int, ReportMessage]] = {}
        # Steps committed in this attempt: a dead rank's recovery sends again every report it staged in it
        # (the step records outlive their uploads), those that retention deleted since too.
        committed_steps: set[int] = set()
        first_done_at: float | None = None
        warned = False
        while len(done) < world_size:
            timeout = None
            if first_done_at is not None and straggler_timeout_s is not None:
                # Some ranks finished: the others get straggler_timeout_s (a warning at half of it).
                waited = time.monotonic() - first_done_at
                running = sorted(set(range(world_size)) - done)
                if waited >= straggler_timeout_s:
                    return straggler_error(running, sorted(done), waited, straggler_timeout_s)
                if not warned and waited >= straggler_timeout_s / 2:
                    warned = True
                    logger.warning(
                        "%s still running %.0f s after %s finished; the attempt fails if still running "
                        "after %.0f s (FailureConfig.straggler_timeout_s).",
                        ranks_text(running).capitalize(),
                        waited,
                        ranks_text(sorted(done)),
                        straggler_timeout_s,
                    )
                timeout = (straggler_timeout_s if warned else straggler_timeout_s / 2) - waited
            if self.scaling_policy is not None:  # elastic runs also wake up to watch nodes and growth
                poll = self._poll_interval()
                timeout = poll if timeout is None else min(timeout, poll)
            for message in self.group.wait(timeout):
                if isinstance(message, ReportMessage):
                    if done and not done <= set(pending.get(message.step, {})):
                        # A rank that finished makes no more reports: this one is never committed. Its folder goes
                        # now, so that a straggler reporting on and on leaves no pile of uncommitted checkpoints.
                        self.commits.drop_uncommittable(message)
                    self.commits.add(pending, committed_steps, world_size, message)
                elif isinstance(message, DoneMessage):
                    done.add(message.rank)
                    if message.rank == 0:
                        self.return_value = unpickled_return_value(message)
                    first_done_at = first_done_at or time.monotonic()
                else:
                    return self._failed(message, pending, committed_steps)
            if self.scaling_policy is not None and not done:  # both rate-limit themselves
                self.watcher.check(self.group)
                if self.scaling_policy.should_grow(world_size):
                    return RESIZE
        if pending:
            return _uneven_reports(pending, world_size)
        return None

    def _failed(
        self, message: FailedMessage, pending: dict[int, dict[int, ReportMessage]], committed_steps: set[int]
    ) -> WorkerError:
        """A rank failed: commit what every rank reported before it, and name the root cause."""
        failures = [worker_error(message, self.plan)]
        preempted = self.watcher.ranks_on_drained(self.node_ids) if self.watcher else set()
        # Reports that every rank made before the failure are not lost.
        flush_s = tunables.FLUSH_AFTER_FAILURE_S + (self.failure_config.preemption_grace_s if preempted else 0.0)
        for late in self.group.flush(flush_s):
            if isinstance(late, ReportMessage):
                self.commits.add(pending, committed_steps, self.world_size, late)
            elif isinstance(late, FailedMessage):
                failures.append(worker_error(late, self.plan))
        if preempted and self.failure_config.relax_collectives_on_preemption:  # the steps every survivor reported
            for step in steps_without(preempted, pending, self.world_size):
                self.commits.commit(step, pending.pop(step))
                committed_steps.add(step)
        self.failures = failures
        return root_cause(failures)

    def _poll_interval(self) -> float:
        growth = self.scaling_policy.poll_interval(self.world_size)
        return min(
            self.watcher.poll_interval() or tunables.PREEMPTION_POLL_INTERVAL_S,
            growth if growth is not None else float("inf"),
        )


def _uneven_reports(pending: dict[int, dict[int, ReportMessage]], world_size: int) -> WorkerError:
    """The error of an attempt whose ranks all finished having called report() different numbers of times."""
    # Every rank's last step this attempt (committed steps were reported by all ranks).
    counts = {rank: min(pending) - 1 for rank in range(world_size)}
    for step, ranks in pending.items():
        for rank in ranks:
            counts[rank] = max(counts[rank], step)
    return WorkerError(
        rank=min(set(range(world_size)) - set(pending[min(pending)])),
        cause=(
            f"the workers called report() different numbers of times (last step per rank: "
            f"{dict(sorted(counts.items()))}): every rank must call trainlib.report() the same "
            "number of times, with or without a checkpoint"
        ),
    )
