"""``PreemptionInfo``: which of the run's nodes Ray is draining (a preemption), and by when. Built on the
driver, read in workers through ``trainlib.get_preemption_info()``."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class PreemptionInfo:
    """An imminent preemption of nodes that hold workers of this run.

    Attributes:
        deadline_ms: the earliest reclaim deadline among the preempted nodes (UNIX
            time in milliseconds), or None when Ray was given none.
        preempted_node_to_ranks: preempted node id -> the world ranks on that node.
    """

    deadline_ms: int | None
    preempted_node_to_ranks: dict[str, list[int]]

    @property
    def preempted_node_ids(self) -> list[str]:
        """The preempted nodes' ids, sorted."""
        return sorted(self.preempted_node_to_ranks)

    @property
    def preempted_ranks(self) -> list[int]:
        """Every world rank on a preempted node, sorted."""
        return sorted({r for ranks in self.preempted_node_to_ranks.values() for r in ranks})
