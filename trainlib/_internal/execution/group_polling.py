"""The messages of a started worker group's actors, and their deaths, as the controller reads them. Driver only.

Each rank has one ``next_messages`` call outstanding at a time, a blocking call that answers with the rank's
queued messages (``messages.py``), so the driver waits on events rather than polling the actors. A call that
fails is the rank's death: before it becomes a failure message, what the dead rank staged on its node's disk is
uploaded from that node (``staging.finish_staged_uploads``), so no report that it made is lost.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trainlib._internal import tunables
from trainlib._internal.execution.failures import death_cause
from trainlib._internal.execution.messages import FailedMessage, WorkerMessage, is_last
from trainlib._internal.execution.spec import Placement
from trainlib._internal.execution.staging import finish_staged_uploads
from trainlib._internal.storage.run_storage import RunStorage

logger = logging.getLogger("trainlib")


class GroupPoller:
    """Reads the messages of one started attempt's actors (by rank): ``wait`` while it runs, ``flush`` after."""

    def __init__(self, actors: list[Any], placements: list[Placement], storage: RunStorage, attempt: int):
        self._actors = actors  # by rank
        self._placements = placements  # by rank
        self._storage = storage  # of the started attempt, for recovering a dead rank's uploads
        self._attempt = attempt  # the started attempt's number: a dead rank's staging folders of it are recovered
        self._pending = {actor.next_messages.remote(): rank for rank, actor in enumerate(actors)}  # ref -> rank

    def wait(self, timeout: float | None = None) -> list[WorkerMessage]:
        """Block until some worker sends messages or dies (or ``timeout`` passes: then []); return them in
        order (a death as a failure)."""
        ready, _ = ray.wait(list(self._pending), num_returns=1, timeout=timeout)
        out: list[WorkerMessage] = []
        for ref in ready:
            rank = self._pending.pop(ref)
            try:
                messages = ray.get(ref)
            except RayActorError as exc:
                messages = self._recover_staged(rank) + [self._death_message(rank, exc)]
            out.extend(messages)
            if not any(is_last(m) for m in messages):
                self._pending[self._actors[rank].next_messages.remote()] = rank
        return out

    def flush(self, timeout: float) -> list[WorkerMessage]:
        """After a failure: collect what the live workers still had queued, uploads included."""
        out: list[WorkerMessage] = []
        refs = {a.flush.remote(timeout): rank for rank, a in enumerate(self._actors)}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout + 1.0)
        # Each rank's outstanding next_messages call holds its earlier messages: the worker's flush woke it, so
        # it answers at once (a dead rank's with its death). Its messages go first: taking only those answered
        # at that instant lost a report now and then, and taking them after flush's committed steps out of order.
        if self._pending:
            ready = ray.wait(list(self._pending), num_returns=len(self._pending), timeout=1.0)[0] + ready
        dead: set[int] = set()
        for ref in ready:
            rank = refs.get(ref, self._pending.get(ref))
            try:
                out.extend(ray.get(ref))
            except RayActorError as exc:
                if rank not in dead:  # its next_messages and its flush both fail: one death, one recovery
                    dead.add(rank)
                    # A rank that died: the controller may pick its death as the root cause.
                    out.extend(self._recover_staged(rank) + [self._death_message(rank, exc)])
        return out

    def _death_message(self, rank: int, exc: BaseException) -> FailedMessage:
        return FailedMessage(rank=rank, cause=rank_death_cause(self._placements, rank, exc))

    def _recover_staged(self, rank: int) -> list[WorkerMessage]:
        """A dead rank's staged-but-not-uploaded checkpoints: uploaded from its node; their REPORT messages.

        Runs before the controller decides where the restart resumes, so no report that the dead
        worker made is lost while its files are still on its node's disk. Bounded in time; when
        the node itself is gone, its staged files are lost and the restart resumes from the latest
        commit (the loss is at most MAX_PENDING_UPLOADS_PER_WORKER + 1 reports, and stated).
        """
        p = self._placements[rank] if rank < len(self._placements) else None
        storage = self._storage
        if storage is None or storage.is_local or p is None:
            return []  # local storage: report() wrote straight into storage, nothing was staged
        task = ray.remote(num_cpus=0, max_retries=0)(finish_staged_uploads).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(p.node_id, soft=False)
        )
        ref = task.remote(storage, rank, p.pid, self._attempt)
        try:
            messages = ray.get(ref, timeout=tunables.FLUSH_AFTER_FAILURE_S)
        except Exception as exc:  # noqa: BLE001 - node lost, or the uploads failed: the loss is stated
            ray.cancel(ref, force=True)
            logger.warning(
                "Rank %d died with checkpoints staged on node %s that could not be uploaded (%s: %s); "
                "the restart resumes from the latest committed checkpoint.",
                rank,
                p.node_ip,
                type(exc).__name__,
                str(exc)[:300],
            )
            return []
        if messages:
            logger.warning(
                "Rank %d died; its node finished the upload of its staged checkpoint(s) for step(s) %s.",
                rank,
                ", ".join(str(m.step) for m in messages),
            )
        return messages


def rank_death_cause(placements: list[Placement], rank: int, exc: BaseException) -> str:
    """Why the actor at ``rank`` of ``placements`` died, naming its pid and node when known."""
    p = placements[rank] if rank < len(placements) else None
    return death_cause(str(exc), p.pid if p else None, p.node_ip if p else None)
