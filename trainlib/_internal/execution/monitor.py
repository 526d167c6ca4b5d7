"""Watching a running group: elastic growth and node preemption. Runs on the driver only.

The controller asks the monitor, between worker messages, whether the group
should be restarted bigger (an elastic run below ``max_workers`` whose cluster
now has room), and the monitor tells the workers when Ray starts draining a
node of theirs (a preemption), so that ``get_preemption_info()`` sees it. A
failure of a rank on a drained node counts against
``FailureConfig.max_preemption_failures`` instead of ``max_failures``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from trainlib._internal import tunables
from trainlib.errors import WorkerError
from trainlib.preemption import PreemptionInfo
from trainlib.scaling import ScalingConfig

logger = logging.getLogger("trainlib")


class ScalingPolicy:
    """How many workers the next attempt gets, and when a running group should grow."""

    def __init__(
        self,
        scaling: ScalingConfig,
        available_workers: Callable[[ScalingConfig], int],
        settle_s: float = tunables.ELASTIC_SETTLE_S,
    ):
        self.scaling = scaling
        self._available = available_workers
        self._settle_s = settle_s
        self._last_check = time.monotonic()
        self._target: int | None = None  # the size a growth decision found room for

    def num_workers(self) -> int:
        """Fixed: ``num_workers``. Elastic: as many as fit now, between ``min_workers`` and ``max_workers``
        (``min_workers`` when fewer fit, so that the placement wait applies)."""
        if not self.scaling.elasticity_enabled:
            return self.scaling.num_workers
        if self._target is not None:  # growing: the room was seen next to the group just stopped
            chosen, self._target = self._target, None
            self._last_check = time.monotonic()
            return chosen
        # Resources of a group that was just stopped come back a moment later: take the best of a few looks.
        fits = self._available(self.scaling)
        deadline = time.monotonic() + self._settle_s
        while fits < self.scaling.max_workers and time.monotonic() < deadline:
            time.sleep(0.25)
            fits = max(fits, self._available(self.scaling))
        chosen = max(self.scaling.min_workers, min(self.scaling.max_workers, fits))
        logger.info(
            "Elastic run: %d worker(s) fit now; starting %d (ScalingConfig.num_workers=%s).",
            fits,
            chosen,
            self.scaling.num_workers,
        )
        self._last_check = time.monotonic()
        return chosen

    def poll_interval(self, world_size: int) -> float | None:
        """How long the controller may wait for messages before asking :meth:`should_grow` again."""
        if not self.scaling.elasticity_enabled or world_size >= self.scaling.max_workers:
            return None
        return max(0.0, self._last_check + self.scaling.elastic_resize_monitor_interval_s - time.monotonic())

    def should_grow(self, world_size: int) -> bool:
        """Whether room for at least one more worker appeared (checked at most once per interval)."""
        if self.poll_interval(world_size) != 0.0:
            return False
        self._last_check = time.monotonic()
        extra = self._available(self.scaling)  # free now, beside what the running group holds
        if extra >= 1:
            self._target = min(self.scaling.max_workers, world_size + extra)
            logger.warning(
                "Elastic run: room for %d more worker(s) appeared; restarting the group with %d from "
                "the latest checkpoint.",
                extra,
                self._target,
            )
            return True
        return False


def draining_nodes() -> dict[str, int]:
    """Ray's nodes being drained: node id -> deadline in ms (0: none)."""
    import ray

    try:
        return dict(ray._private.state.state.get_draining_nodes() or {})
    except Exception:  # noqa: BLE001 - an older or newer Ray without this call: no preemption signal
        return {}


class PreemptionWatcher:
    """Notices Ray draining nodes that hold workers of the group, and tells the workers once."""

    def __init__(self, get_draining: Callable[[], dict[str, int]] = draining_nodes):
        self._get_draining = get_draining
        self.drained: set[str] = set()  # every node of the run seen draining
        self._told: PreemptionInfo | None = None
        self._last_poll = 0.0

    def poll_interval(self) -> float:
        return max(0.0, self._last_poll + tunables.PREEMPTION_POLL_INTERVAL_S - time.monotonic())

    def check(self, group: Any) -> None:
        """Poll Ray (at most once per interval); on a new drain of our nodes, tell every worker."""
        if self.poll_interval() > 0:
            return
        self._last_poll = time.monotonic()
        node_ids = group.node_ids()
        draining = {n: d for n, d in self._get_draining().items() if n in node_ids}
        if not draining or set(draining) <= self.drained and self._told is not None:
            return
        self.drained |= set(draining)
        deadlines = [d for d in draining.values() if d]
        info = PreemptionInfo(
            deadline_ms=min(deadlines) if deadlines else None,
            preempted_node_to_ranks={n: [r for r, node in enumerate(node_ids) if node == n] for n in draining},
        )
        logger.warning(
            "Ray is draining node(s) %s of this run (preemption, ranks %s); the workers are told "
            "(trainlib.get_preemption_info()).",
            info.preempted_node_ids,
            info.preempted_ranks,
        )
        group.notify_preemption(info)
        self._told = info

    def ranks_on_drained(self, node_ids: list[str]) -> set[int]:
        """The ranks (``node_ids``: each rank's node) on nodes seen draining; empty without a preemption."""
        return {rank for rank, node in enumerate(node_ids) if node in self.drained}

    def caused(self, failure: WorkerError, node_ids: list[str]) -> bool:
        """Whether ``failure`` happened on a node that was being drained (a preemption, not a fault)."""
        if not self.drained or not 0 <= failure.rank < len(node_ids):
            return False
        return node_ids[failure.rank] in self.drained or bool(set(draining_nodes()) & set(node_ids))


def steps_without(preempted: set[int], pending: dict[int, dict[int, Any]], world_size: int) -> list[int]:
    """``FailureConfig.relax_collectives_on_preemption``: of the steps not yet reported by every rank (``pending``:
    step -> rank -> report), those every rank outside ``preempted`` reported, oldest first; none when rank 0 is
    preempted (its report carries the metrics; Ray Train never relaxes rank 0 either)."""
    if 0 in preempted:
        logger.info(
            "Rank 0 is being preempted (preempted ranks: %s), so relax_collectives_on_preemption is ignored.",
            sorted(preempted),
        )
        return []
    survivors = set(range(world_size)) - preempted
    steps = [step for step in sorted(pending) if survivors <= set(pending[step])]
    for step in steps:
        logger.warning(
            "Committing step %d without the preempted rank(s) %s (FailureConfig.relax_collectives_on_preemption): "
            "its checkpoint holds the surviving ranks' files only.",
            step,
            sorted(preempted),
        )
    return steps
