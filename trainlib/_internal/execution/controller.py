"""The run controller: a small state machine over worker-group attempts. Runs on the driver only.

    SCHEDULING -> RUNNING -> FINISHED
                     |
                     v  (a worker raised or died)
                 RESTARTING -> SCHEDULING ...   while the RestartPolicy allows
                     |
                     v
                  FAILED

The states are ``RunStatus`` members, the same enum as the run record's status.

The controller starts each attempt's worker group and runs the attempt's loop (``attempt_loop.py``), which
hands each report to the committer (``report_committer.py``: checkpoint marker written last, metrics log,
retention, callbacks); after a failed attempt the restart policy (``restart_policy.py``) decides whether the
group restarts. It talks to workers only through a worker group (``WorkerGroup`` protocol,
``group_protocol.py``), so tests can swap in a fake group and test the failure logic without a cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from trainlib._internal.execution.attempt_loop import AttemptLoop
from trainlib._internal.execution.callback_runner import CallbackRunner
from trainlib._internal.execution.group_protocol import Resize, WorkerGroup
from trainlib._internal.execution.monitor import PreemptionWatcher, ScalingPolicy
from trainlib._internal.execution.report_committer import ReportCommitter
from trainlib._internal.execution.restart_policy import RestartPolicy
from trainlib._internal.execution.spec import AttemptSpec
from trainlib._internal.storage.commits import CommittedCheckpoint
from trainlib._internal.storage.lease import RunLease
from trainlib._internal.storage.run_record import RunStatus
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.callbacks import Callback, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig, FailureConfig
from trainlib.errors import StorageError, WorkerError

logger = logging.getLogger("trainlib")


class Controller:
    """Runs attempts of a worker group until the training function finishes on every rank."""

    def __init__(
        self,
        *,
        storage: RunStorage,
        make_worker_group: Callable[[], WorkerGroup],
        checkpoint_config: CheckpointConfig,
        failure_config: FailureConfig,
        callbacks: list[Callback],
        run_info: RunInfo,
        start_checkpoint: Checkpoint | None = None,
        metrics_rows: list[dict[str, Any]] | None = None,
        committed: list[CommittedCheckpoint] | None = None,
        verbose: bool = True,
        scaling_policy: ScalingPolicy | None = None,
        metadata: dict[str, Any] | None = None,
        lease: RunLease | None = None,
    ):
        self.storage = storage
        self.make_worker_group = make_worker_group
        self.failure_config = failure_config
        self.restarts = RestartPolicy(failure_config)
        self.scaling_policy = scaling_policy  # elastic sizing and growth; None: a fixed group, no monitoring
        self.watcher = PreemptionWatcher() if scaling_policy is not None else None
        self.last_failures: list[WorkerError] = []  # every rank's failure in the last failed attempt
        self._node_ids: list[str] = []
        self.callbacks = callbacks
        self.callback_runner = CallbackRunner(callbacks)  # hooks run off the commit path
        self.run_info = run_info
        self.commits = ReportCommitter(
            storage=storage,
            checkpoint_config=checkpoint_config,
            run_info=run_info,
            callback_runner=self.callback_runner,
            metrics_rows=metrics_rows,
            committed=committed,
            metadata=metadata,
            lease=lease,
            verbose=verbose,
        )
        self.external_checkpoint = start_checkpoint
        self.state = RunStatus.SCHEDULING
        self.num_nodes = 1
        self.return_value: Any = None  # rank 0's, from the attempt that finished (Result.return_value)

    # -- the state machine -------------------------------------------------------

    def run(self) -> None:
        """Run to the end. Raises TrainingFailedError when failures exceed the policy."""
        while True:
            self.state = RunStatus.SCHEDULING
            group = self.make_worker_group()
            try:
                failure = self._run_attempt(group)
            except WorkerError as error:  # an actor died while the group was starting
                failure = error
            finally:
                group.shutdown()
            if failure is None:
                self.state = RunStatus.FINISHED
                return
            self.state = RunStatus.RESTARTING
            self.commits.attempt += 1
            if isinstance(failure, Resize):  # not a failure: no budget used
                continue
            preempted = self.watcher is not None and self.watcher.caused(failure, self._node_ids)
            error = self.restarts.count(failure, preempted, self.last_failures)
            self.callback_runner.notify("after_failure", self.run_info, failure, error is None)
            if error is not None:
                self.state = RunStatus.FAILED
                raise error
            latest = self.latest_checkpoint()
            logger.warning(
                "Worker rank %d failed (%s); restarting the group (restart %s) from %s.",
                failure.rank,
                failure.cause,
                self.restarts.restarts_text(),
                latest.uri if latest else "the beginning (no checkpoint yet)",
            )

    def latest_checkpoint(self) -> Checkpoint | None:
        if self.commits.committed:
            return Checkpoint(self.commits.committed[-1].path, self.storage.fs)
        return self.external_checkpoint

    def _run_attempt(self, group: WorkerGroup) -> WorkerError | Resize | None:
        group.start_actors()
        # A crash may have left checkpoint folders that were never committed: clear them while
        # the actors start.
        for path in self.storage.remove_uncommitted():
            logger.info("Removed uncommitted checkpoint folder %s", self.storage.uri(path))
        placements = group.placements()
        self.num_nodes = len({p.node_id for p in placements})
        if self.num_nodes > 1 and not self.storage.shared:
            raise StorageError(
                f"The workers run on {self.num_nodes} nodes but RunConfig.storage_path "
                f"({self.storage.root!r}) is a local folder, which the other nodes cannot see: use shared "
                "storage that every node reaches, e.g. storage_path='s3://bucket/runs', or a mount that every "
                "node has (NFS) written as a file:// URL, which declares it shared: 'file:///mnt/nfs/runs'."
            )
        committed = self.commits.committed
        first_step = committed[-1].step + 1 if committed else 1
        plan = group.start(
            AttemptSpec(
                attempt=self.commits.attempt,
                storage=self.storage,
                checkpoint=self.latest_checkpoint(),
                first_step=first_step,
            )
        )
        world_size = len(placements)
        self._node_ids = [placements[i].node_id for i in (plan.order if plan is not None else range(world_size))]
        self.state = RunStatus.RUNNING
        loop = AttemptLoop(
            group=group,
            world_size=world_size,
            plan=plan,
            node_ids=self._node_ids,
            commits=self.commits,
            failure_config=self.failure_config,
            scaling_policy=self.scaling_policy,
            watcher=self.watcher,
        )
        try:
            return loop.run()
        finally:
            if 0 in loop.done:
                self.return_value = loop.return_value
            if loop.failures:
                self.last_failures = loop.failures
