"""The run controller: a small state machine over worker-group attempts. Runs on the driver only.

    SCHEDULING -> RUNNING -> FINISHED
                     |
                     v  (a worker raised or died)
                 RESTARTING -> SCHEDULING ...   while FailurePolicy allows
                     |
                     v
                  FAILED

The states are ``RunStatus`` members, the same enum as the run record's status.

The controller gathers each report from all ranks, commits its checkpoint
(marker written last), appends the metrics log, applies retention and calls
the callbacks. It talks to workers only through a worker group (``WorkerGroup``
protocol), so tests can swap in a fake group and test the failure logic without a cluster.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable
from typing import Any, Protocol

from trainlib._internal import tunables
from trainlib._internal.execution.callback_runner import CallbackRunner
from trainlib._internal.execution.commit import check_arrived, commit_folder, write_metadata
from trainlib._internal.execution.failures import FailurePolicy, ranks_text, root_cause, straggler_error, worker_error
from trainlib._internal.execution.messages import DoneMessage, FailedMessage, ReportMessage, WorkerMessage
from trainlib._internal.execution.monitor import PreemptionWatcher, ScalingPolicy, steps_without
from trainlib._internal.execution.placement import RankPlan
from trainlib._internal.execution.spec import AttemptSpec, Placement
from trainlib._internal.storage.commits import CommittedCheckpoint, merge_manifests
from trainlib._internal.storage.lease import RunLease
from trainlib._internal.storage.retention import checkpoints_to_delete, warn_if_unscored
from trainlib._internal.storage.run_record import RunStatus
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.callbacks import Callback, ReportRecord, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig, FailureConfig
from trainlib.errors import StorageError, WorkerError, WorkerGroupError

logger = logging.getLogger("trainlib")


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
        self.checkpoint_config = checkpoint_config
        self.policy = FailurePolicy(failure_config.max_failures)
        self.straggler_timeout_s = failure_config.straggler_timeout_s
        self.preemption_policy = FailurePolicy(failure_config.max_preemption_failures)
        self.relax_on_preemption = failure_config.relax_collectives_on_preemption
        self.preemption_grace_s = failure_config.preemption_grace_s
        self.scaling_policy = scaling_policy  # elastic sizing and growth; None: a fixed group, no monitoring
        self.watcher = PreemptionWatcher() if scaling_policy is not None else None
        self.metadata = metadata
        self.preemptions: list[WorkerError] = []
        self.last_failures: list[WorkerError] = []  # every rank's failure in the last failed attempt
        self._node_ids: list[str] = []
        self.callbacks = callbacks
        self.callback_runner = CallbackRunner(callbacks)  # hooks run off the commit path
        self.lease = lease  # checked before each commit
        self._warned_shared: set[str] = set()
        self._warned_uncommittable = False
        self.run_info = run_info
        self.external_checkpoint = start_checkpoint
        self.metrics_rows = list(metrics_rows or [])
        self.committed = list(committed or [])
        self.verbose = verbose
        self.state = RunStatus.SCHEDULING
        self.failures: list[WorkerError] = []
        # A resumed run continues the attempt numbering of its metrics log, so rows of the
        # earlier driver runs and of this one never share an attempt number.
        self.attempt = 1 + max((int(r.get("attempt", 0)) for r in self.metrics_rows), default=-1)
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
            self.attempt += 1
            if isinstance(failure, Resize):  # not a failure: no budget used
                continue
            preempted = self.watcher is not None and self.watcher.caused(failure, self._node_ids)
            counted = self.preemptions if preempted and self.preemption_policy.max_failures != 0 else self.failures
            counted.append(failure)
            policy = self.preemption_policy if counted is self.preemptions else self.policy
            will_restart = policy.should_restart(len(counted))
            self._notify("after_failure", self.run_info, failure, will_restart)
            if not will_restart:
                self.state = RunStatus.FAILED
                raise WorkerGroupError(
                    counted, policy.max_failures, {f.rank: f.__cause__ or f for f in self.last_failures or [failure]}
                )
            latest = self.latest_checkpoint()
            logger.warning(
                "Worker rank %d failed (%s); restarting the group (restart %d%s) from %s.",
                failure.rank,
                failure.cause,
                len(self.failures),
                "" if self.policy.max_failures < 0 else f" of {self.policy.max_failures}",
                latest.uri if latest else "the beginning (no checkpoint yet)",
            )

    def latest_checkpoint(self) -> Checkpoint | None:
        if self.committed:
            return Checkpoint(self.committed[-1].path, self.storage.fs)
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
        first_step = self.committed[-1].step + 1 if self.committed else 1
        plan = group.start(
            AttemptSpec(
                attempt=self.attempt, storage=self.storage, checkpoint=self.latest_checkpoint(), first_step=first_step
            )
        )
        world_size = len(placements)
        self._node_ids = [placements[i].node_id for i in (plan.order if plan is not None else range(world_size))]
        self.state = RunStatus.RUNNING
        return self._collect(group, world_size, plan)

    def _collect(self, group: WorkerGroup, world_size: int, plan: RankPlan | None) -> WorkerError | Resize | None:
        pending: dict[int, dict[int, ReportMessage]] = {}
        # Steps committed in this attempt: a dead rank's recovery sends again every report it staged in it
        # (the step records outlive their uploads), those that retention deleted since too.
        committed_steps: set[int] = set()
        done: set[int] = set()
        first_done_at: float | None = None
        warned = False
        while len(done) < world_size:
            timeout = None
            if first_done_at is not None and self.straggler_timeout_s is not None:
                # Some ranks finished: the others get straggler_timeout_s (a warning at half of it).
                waited = time.monotonic() - first_done_at
                running = sorted(set(range(world_size)) - done)
                if waited >= self.straggler_timeout_s:
                    return straggler_error(running, sorted(done), waited, self.straggler_timeout_s)
                if not warned and waited >= self.straggler_timeout_s / 2:
                    warned = True
                    logger.warning(
                        "%s still running %.0f s after %s finished; the attempt fails if still running "
                        "after %.0f s (FailureConfig.straggler_timeout_s).",
                        ranks_text(running).capitalize(),
                        waited,
                        ranks_text(sorted(done)),
                        self.straggler_timeout_s,
                    )
                timeout = (self.straggler_timeout_s if warned else self.straggler_timeout_s / 2) - waited
            if self.scaling_policy is not None:  # elastic runs also wake up to watch nodes and growth
                poll = self._poll_interval(world_size)
                timeout = poll if timeout is None else min(timeout, poll)
            for message in group.wait(timeout):
                if isinstance(message, ReportMessage):
                    if done and not done <= set(pending.get(message.step, {})):
                        # A rank that finished makes no more reports: this one is never committed. Its folder goes
                        # now, so that a straggler reporting on and on leaves no pile of uncommitted checkpoints.
                        self._drop_uncommittable(message)
                    self._add_report(pending, committed_steps, world_size, message)
                elif isinstance(message, DoneMessage):
                    done.add(message.rank)
                    if message.rank == 0:
                        self.return_value = _return_value(message)
                    first_done_at = first_done_at or time.monotonic()
                else:
                    failures = [worker_error(message, plan)]
                    preempted = self.watcher.ranks_on_drained(self._node_ids) if self.watcher else set()
                    # Reports that every rank made before the failure are not lost.
                    flush_s = tunables.FLUSH_AFTER_FAILURE_S + (self.preemption_grace_s if preempted else 0.0)
                    for late in group.flush(flush_s):
                        if isinstance(late, ReportMessage):
                            self._add_report(pending, committed_steps, world_size, late)
                        elif isinstance(late, FailedMessage):
                            failures.append(worker_error(late, plan))
                    if preempted and self.relax_on_preemption:  # the steps every surviving rank reported
                        for step in steps_without(preempted, pending, world_size):
                            self._commit(step, pending.pop(step))
                            committed_steps.add(step)
                    self.last_failures = failures
                    return root_cause(failures)
            if self.scaling_policy is not None and not done:  # both rate-limit themselves
                self.watcher.check(group)
                if self.scaling_policy.should_grow(world_size):
                    return RESIZE
        if pending:
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
        return None

    # -- reports -----------------------------------------------------------------

    def _poll_interval(self, world_size: int) -> float:
        growth = self.scaling_policy.poll_interval(world_size)
        return min(
            self.watcher.poll_interval() or tunables.PREEMPTION_POLL_INTERVAL_S,
            growth if growth is not None else float("inf"),
        )

    def _add_report(
        self,
        pending: dict[int, dict[int, ReportMessage]],
        committed_steps: set[int],
        world_size: int,
        message: ReportMessage,
    ) -> None:
        if message.step not in pending and message.step in committed_steps:
            return  # a dead rank's recovered report of a step committed already (and maybe deleted since)
        pending.setdefault(message.step, {})[message.rank] = message
        if len(pending[message.step]) == world_size:
            self._commit(message.step, pending.pop(message.step))
            committed_steps.add(message.step)

    def _commit(self, step: int, ranks: dict[int, ReportMessage]) -> None:
        metrics = ranks[0].metrics
        manifests = {rank: r.manifest for rank, r in ranks.items() if r.manifest is not None}
        placements = [r.placement for r in ranks.values() if r.placement is not None]
        checkpoint = None
        if self.lease is not None:
            self.lease.check()  # never commit into a run that another driver took over
        if manifests or placements:
            dir_name = commit_folder(step, placements)
            path = self.storage.checkpoint_path(step, dir_name)
            merged = self._merge_manifests(step, path, manifests)
            stored = self.storage.list_files(path)
            if any(p.in_place for p in placements):  # written by the user: complete now that every rank reported
                merged.update(stored)
            check_arrived(step, self.storage.uri(path), manifests, stored)
            write_metadata(self.storage, path, self.metadata, merged)
            committed = self.storage.commit_checkpoint(step, metrics, merged, dir_name)
            # An earlier checkpoint in the same folder (a reused checkpoint_dir_name) lost its marker to this one:
            # it is gone, and retention must not delete the folder as its.
            self.committed = sorted(
                [c for c in self.committed if c.step != step and c.path != committed.path] + [committed],
                key=lambda c: c.step,
            )
            warn_if_unscored(committed, self.checkpoint_config)
            checkpoint = Checkpoint(committed.path, self.storage.fs)
        row = {
            "step": step,
            "attempt": self.attempt,
            "time": max(r.reported_at for r in ranks.values()),
            "checkpoint": posixpath.basename(checkpoint.path) if checkpoint else None,
            "metrics": metrics,
        }
        self.metrics_rows.append(row)
        self.storage.append_metrics_row(row, self.metrics_rows)
        if checkpoint is not None:
            self._apply_retention()
        if self.verbose:
            shown = ", ".join(f"{k}={_fmt_value(v)}" for k, v in metrics.items())
            suffix = f" -> {checkpoint.uri}" if checkpoint else ""
            logger.info("[%s] step %d: %s%s", self.storage.name, step, shown, suffix)
        self._notify(
            "after_report",
            self.run_info,
            ReportRecord(
                step=step, metrics=metrics, checkpoint=checkpoint, attempt=self.attempt, reported_at=row["time"]
            ),
        )

    def _drop_uncommittable(self, message: ReportMessage) -> None:
        if message.manifest is None or (message.placement is not None and message.placement.in_place):
            return  # no checkpoint, or the user's own folder
        path = self.storage.checkpoint_path(message.step, message.placement.dir_name if message.placement else None)
        if not self._warned_uncommittable:
            self._warned_uncommittable = True
            logger.warning(
                "Rank %d reported step %d after another rank finished: that report and later ones cannot be "
                "committed, so their checkpoint folders are deleted as they arrive (%s).",
                message.rank,
                message.step,
                self.storage.uri(path),
            )
        self.storage.delete_checkpoint(path)

    def _merge_manifests(self, step: int, path: str, manifests: dict[int, dict[str, int]]) -> dict[str, int]:
        merged, shared = merge_manifests(manifests)
        for rel, writers in shared.items():
            # The last upload won: record the stored size, so the commit stays verifiable.
            merged[rel] = self.storage.fs.size(posixpath.join(path, rel))
            if rel not in self._warned_shared:
                self._warned_shared.add(rel)
                logger.warning(
                    "Ranks %s all wrote %r into checkpoint %d: the stored file is one of them (the last upload). "
                    "Save it from one rank only (if trainlib.get_context().get_world_rank() == 0), or give each "
                    "rank's file its own name (e.g. f'shard_{rank}.pt').",
                    writers,
                    rel,
                    step,
                )
        return merged

    def _apply_retention(self) -> None:
        for doomed in checkpoints_to_delete(self.committed, self.checkpoint_config):
            self.storage.delete_checkpoint(doomed.path)
            self.committed.remove(doomed)
            self._notify("after_checkpoint_deleted", self.run_info, Checkpoint(doomed.path, self.storage.fs))

    def _notify(self, hook: str, *args: Any) -> None:
        self.callback_runner.notify(hook, *args)


def _return_value(message: DoneMessage) -> Any:
    try:
        return message.return_value()
    except Exception as exc:  # noqa: BLE001 - e.g. its class is not importable here; the run itself finished
        logger.warning(
            "Rank 0's return value cannot be unpickled on the driver (%s: %s): Result.return_value is "
            "None. Return plain values (numbers, lists, dicts, tensors).",
            type(exc).__name__,
            exc,
        )
        return None


def _fmt_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
