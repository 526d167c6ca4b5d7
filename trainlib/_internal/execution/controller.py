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

import dataclasses
import logging
from typing import Any, Callable, Protocol

import cloudpickle

from trainlib._internal import tunables
from trainlib._internal.execution.messages import DoneMessage, FailedMessage, ReportMessage, WorkerMessage
from trainlib._internal.execution.spec import AttemptSpec, Placement
from trainlib._internal.storage.commits import CommittedCheckpoint, checkpoint_dir_name
from trainlib._internal.storage.retention import checkpoints_to_delete, warn_if_unscored
from trainlib._internal.storage.run_record import RunStatus
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.callbacks import Callback, ReportRecord, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig, FailureConfig
from trainlib.errors import StorageError, TrainingFailedError, WorkerError

logger = logging.getLogger("trainlib")


class WorkerGroup(Protocol):
    """The workers of one attempt, as the controller sees them (``RayWorkerGroup``, or a fake in tests)."""

    plan: Any

    def start_actors(self) -> None: ...
    def placements(self) -> list[Placement]: ...
    def start(self, attempt: AttemptSpec) -> Any: ...
    def wait(self) -> list[WorkerMessage]: ...
    def flush(self, timeout: float) -> list[WorkerMessage]: ...
    def shutdown(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class FailurePolicy:
    """Decides, after each failure, whether the group restarts."""

    max_failures: int

    def should_restart(self, failures_so_far: int) -> bool:
        return self.max_failures < 0 or failures_so_far <= self.max_failures


class Controller:
    """Runs attempts of a worker group until the training function finishes on every rank."""

    def __init__(self, *, storage: RunStorage, make_worker_group: Callable[[], WorkerGroup], checkpoint_config: CheckpointConfig,
                 failure_config: FailureConfig, callbacks: list[Callback], run_info: RunInfo,
                 start_checkpoint: Checkpoint | None = None, metrics_rows: list[dict[str, Any]] | None = None,
                 committed: list[CommittedCheckpoint] | None = None, verbose: bool = True):
        self.storage = storage
        self.make_worker_group = make_worker_group
        self.checkpoint_config = checkpoint_config
        self.policy = FailurePolicy(failure_config.max_failures)
        self.callbacks = callbacks
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
            self.failures.append(failure)
            will_restart = self.policy.should_restart(len(self.failures))
            self._notify("after_failure", self.run_info, failure, will_restart)
            if not will_restart:
                self.state = RunStatus.FAILED
                raise TrainingFailedError(self.failures, self.policy.max_failures)
            self.state = RunStatus.RESTARTING
            self.attempt += 1
            latest = self.latest_checkpoint()
            logger.warning("Worker rank %d failed (%s); restarting the group (restart %d%s) from %s.",
                           failure.rank, failure.cause, len(self.failures),
                           "" if self.policy.max_failures < 0 else f" of {self.policy.max_failures}",
                           latest.uri if latest else "the beginning (no checkpoint yet)")

    def latest_checkpoint(self) -> Checkpoint | None:
        if self.committed:
            return Checkpoint(self.committed[-1].path, self.storage.fs)
        return self.external_checkpoint

    def _run_attempt(self, group: WorkerGroup) -> WorkerError | None:
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
        plan = group.start(AttemptSpec(attempt=self.attempt, storage=self.storage,
                                       checkpoint=self.latest_checkpoint(), first_step=first_step))
        world_size = len(placements)
        self.state = RunStatus.RUNNING
        return self._collect(group, world_size, plan)

    def _collect(self, group: WorkerGroup, world_size: int, plan: Any) -> WorkerError | None:
        pending: dict[int, dict[int, ReportMessage]] = {}
        done: set[int] = set()
        while len(done) < world_size:
            for message in group.wait():
                if isinstance(message, ReportMessage):
                    self._add_report(pending, world_size, message)
                elif isinstance(message, DoneMessage):
                    done.add(message.rank)
                else:
                    failures = [self._worker_error(message, plan)]
                    # Reports that every rank made before the failure are not lost.
                    for late in group.flush(tunables.FLUSH_AFTER_FAILURE_S):
                        if isinstance(late, ReportMessage):
                            self._add_report(pending, world_size, late)
                        elif isinstance(late, FailedMessage):
                            failures.append(self._worker_error(late, plan))
                    return root_cause(failures)
        if pending:
            # Every rank's last step this attempt (committed steps were reported by all ranks).
            counts = {rank: min(pending) - 1 for rank in range(world_size)}
            for step, ranks in pending.items():
                for rank in ranks:
                    counts[rank] = max(counts[rank], step)
            return WorkerError(
                rank=min(set(range(world_size)) - set(pending[min(pending)])),
                cause=(f"the workers called report() different numbers of times (last step per rank: "
                       f"{dict(sorted(counts.items()))}): every rank must call trainlib.report() the same "
                       "number of times, with or without a checkpoint"),
            )
        return None

    def _worker_error(self, message: FailedMessage, plan: Any) -> WorkerError:
        rank = message.rank
        node_ip = plan.node_ips[rank] if plan is not None and hasattr(plan, "node_ips") else ""
        error = WorkerError(rank=rank, cause=message.cause, traceback_text=message.traceback_text, node_ip=node_ip)
        if message.exception_payload is not None:
            try:
                error.__cause__ = cloudpickle.loads(message.exception_payload)
            except Exception:  # noqa: BLE001 - the exception's class may not import on the driver
                pass
        return error

    # -- reports -----------------------------------------------------------------

    def _add_report(self, pending: dict[int, dict[int, ReportMessage]], world_size: int,
                    message: ReportMessage) -> None:
        pending.setdefault(message.step, {})[message.rank] = message
        if len(pending[message.step]) == world_size:
            self._commit(message.step, pending.pop(message.step))

    def _commit(self, step: int, ranks: dict[int, ReportMessage]) -> None:
        metrics = ranks[0].metrics
        manifests = [r.manifest for r in ranks.values() if r.manifest is not None]
        checkpoint = None
        if manifests:
            merged: dict[str, int] = {}
            for manifest in manifests:
                merged.update(manifest)
            committed = self.storage.commit_checkpoint(step, metrics, merged)
            self.committed = [c for c in self.committed if c.step != step] + [committed]
            warn_if_unscored(committed, self.checkpoint_config)
            checkpoint = Checkpoint(committed.path, self.storage.fs)
        row = {"step": step, "attempt": self.attempt, "time": max(r.reported_at for r in ranks.values()),
               "checkpoint": checkpoint_dir_name(step) if checkpoint else None, "metrics": metrics}
        self.metrics_rows.append(row)
        self.storage.append_metrics_row(row, self.metrics_rows)
        if checkpoint is not None:
            self._apply_retention()
        if self.verbose:
            shown = ", ".join(f"{k}={_fmt_value(v)}" for k, v in metrics.items())
            suffix = f" -> {checkpoint.uri}" if checkpoint else ""
            logger.info("[%s] step %d: %s%s", self.storage.name, step, shown, suffix)
        self._notify("after_report", self.run_info,
                     ReportRecord(step=step, metrics=metrics, checkpoint=checkpoint, attempt=self.attempt,
                                  reported_at=row["time"]))

    def _apply_retention(self) -> None:
        for doomed in checkpoints_to_delete(self.committed, self.checkpoint_config):
            self.storage.delete_checkpoint(doomed.path)
            self.committed.remove(doomed)
            self._notify("after_checkpoint_deleted", self.run_info, Checkpoint(doomed.path, self.storage.fs))

    def _notify(self, hook: str, *args: Any) -> None:
        for callback in self.callbacks:
            try:
                getattr(callback, hook)(*args)
            except Exception as exc:  # noqa: BLE001 - a callback never fails training
                logger.warning("Callback %s.%s failed: %s: %s", type(callback).__name__, hook,
                               type(exc).__name__, exc)


# Errors a rank gets because a peer died or failed (its collective lost the connection):
# they are consequences, and the peer's own failure is the one to report.
_PEER_LOST_SIGNS = ("connection reset by peer", "connection closed by peer", "broken pipe",
                    "nccl communicator was aborted", "remote process exited")


def root_cause(failures: list[WorkerError]) -> WorkerError:
    """The failure to report among those of one attempt: the first that is not a lost-peer echo."""
    def is_echo(failure: WorkerError) -> bool:
        return any(sign in failure.cause.lower() for sign in _PEER_LOST_SIGNS)

    first = next((f for f in failures if not is_echo(f)), failures[0])
    for other in failures:
        if other is not first and other.rank != first.rank:
            logger.info("Rank %d also failed, after rank %d: %s", other.rank, first.rank, other.cause[:300])
    return first


def _fmt_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)

