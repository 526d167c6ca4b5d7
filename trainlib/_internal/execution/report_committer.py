"""The driver's commits of reports: each step that every rank reported becomes one commit. Driver only.

A commit checks that every rank's checkpoint files arrived, writes the checkpoint's marker last, appends the
step's row to the metrics log, applies retention and queues the callbacks' hooks. The committer holds what the
run committed so far (``committed``, ``metrics_rows``) and the attempt number its rows carry.
"""

from __future__ import annotations

import logging
import posixpath
from typing import Any

from trainlib._internal.execution.callback_runner import CallbackRunner
from trainlib._internal.execution.commit import check_arrived, commit_folder, merged_manifest, write_metadata
from trainlib._internal.execution.messages import ReportMessage
from trainlib._internal.storage.commits import CommittedCheckpoint
from trainlib._internal.storage.lease import RunLease
from trainlib._internal.storage.retention import checkpoints_to_delete, warn_if_unscored
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.callbacks import ReportRecord, RunInfo
from trainlib.checkpoint import Checkpoint
from trainlib.config import CheckpointConfig

logger = logging.getLogger("trainlib")


class ReportCommitter:
    """Gathers the ranks' reports of each step and commits a step once every rank reported it."""

    def __init__(
        self,
        *,
        storage: RunStorage,
        checkpoint_config: CheckpointConfig,
        run_info: RunInfo,
        callback_runner: CallbackRunner,
        metrics_rows: list[dict[str, Any]] | None = None,
        committed: list[CommittedCheckpoint] | None = None,
        metadata: dict[str, Any] | None = None,
        lease: RunLease | None = None,
        verbose: bool = True,
    ):
        self.storage = storage
        self.checkpoint_config = checkpoint_config
        self.run_info = run_info
        self.callback_runner = callback_runner  # hooks run off the commit path
        self.metrics_rows = list(metrics_rows or [])
        self.committed = list(committed or [])
        self.metadata = metadata
        self.lease = lease  # checked before each commit
        self.verbose = verbose
        # A resumed run continues the attempt numbering of its metrics log, so rows of the
        # earlier driver runs and of this one never share an attempt number.
        self.attempt = 1 + max((int(r.get("attempt", 0)) for r in self.metrics_rows), default=-1)
        self._warned_shared: set[str] = set()
        self._warned_uncommittable = False

    def add(
        self,
        pending: dict[int, dict[int, ReportMessage]],
        committed_steps: set[int],
        world_size: int,
        message: ReportMessage,
    ) -> None:
        """Add one rank's report to ``pending`` (step -> rank -> report); commit its step once every rank made it."""
        if message.step not in pending and message.step in committed_steps:
            return  # a dead rank's recovered report of a step committed already (and maybe deleted since)
        pending.setdefault(message.step, {})[message.rank] = message
        if len(pending[message.step]) == world_size:
            self.commit(message.step, pending.pop(message.step))
            committed_steps.add(message.step)

    def commit(self, step: int, ranks: dict[int, ReportMessage]) -> None:
        """Commit ``step`` from every rank's report of it: checkpoint, metrics row, retention, callbacks."""
        metrics = ranks[0].metrics
        manifests = {rank: r.manifest for rank, r in ranks.items() if r.manifest is not None}
        placements = [r.placement for r in ranks.values() if r.placement is not None]
        checkpoint = None
        if self.lease is not None:
            self.lease.check()  # never commit into a run that another driver took over
        if manifests or placements:
            dir_name = commit_folder(step, placements)
            path = self.storage.checkpoint_path(step, dir_name)
            merged = merged_manifest(self.storage, step, path, manifests, self._warned_shared)
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
            self.apply_retention()
        if self.verbose:
            shown = ", ".join(f"{k}={_fmt_value(v)}" for k, v in metrics.items())
            suffix = f" -> {checkpoint.uri}" if checkpoint else ""
            logger.info("[%s] step %d: %s%s", self.storage.name, step, shown, suffix)
        self.callback_runner.notify(
            "after_report",
            self.run_info,
            ReportRecord(
                step=step, metrics=metrics, checkpoint=checkpoint, attempt=self.attempt, reported_at=row["time"]
            ),
        )

    def drop_uncommittable(self, message: ReportMessage) -> None:
        """Delete the checkpoint folder of a report that can never be committed (a rank finished before it)."""
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

    def apply_retention(self, keep_latest: bool = True) -> None:
        """Delete the committed checkpoints that ``CheckpointConfig`` does not keep, telling the callbacks.

        ``keep_latest=False`` when the run finished: no checkpoint to resume from is needed any more.
        """
        for doomed in checkpoints_to_delete(self.committed, self.checkpoint_config, keep_latest=keep_latest):
            self.storage.delete_checkpoint(doomed.path)
            self.committed.remove(doomed)
            self.callback_runner.notify(
                "after_checkpoint_deleted", self.run_info, Checkpoint(doomed.path, self.storage.fs)
            )


def _fmt_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
