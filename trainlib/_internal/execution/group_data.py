"""The data a worker group hands its workers, and the check that Ray Data has a CPU to produce it. Driver only."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import ray

logger = logging.getLogger("trainlib")


@dataclasses.dataclass
class GroupData:
    """What every worker of a group gets besides its rank: the trainer's metadata and its dataset shards."""

    metadata: dict[str, Any] | None = None
    datasets: dict[str, Any] | None = None  # name -> ray.data.Dataset (or a function that returns one)
    data_config: Any = None  # trainlib.DataConfig

    def shards_for(self, actors: list[Any], node_ids: list[str]) -> list[dict[str, Any] | None]:
        """One dict of ``DataIterator`` per rank: the datasets split anew for this group (its size)."""
        if not self.datasets:
            return [None] * len(actors)
        datasets = {
            name: ds() if callable(ds) and not hasattr(ds, "streaming_split") else ds
            for name, ds in self.datasets.items()
        }
        warn_if_no_cpu_for_data(sorted(datasets))
        return self.data_config.configure(
            datasets, world_size=len(actors), worker_handles=actors, worker_node_ids=node_ids
        )


def warn_if_no_cpu_for_data(names: list[str]) -> None:
    """Warn when the workers' placement group left no CPU in the cluster for Ray Data's read and map tasks.

    Those tasks need a CPU each; with none free the shards never produce a batch and the workers
    wait on them with no error (seen: 2 one-CPU workers on a 2-CPU Ray). A warning, not an error:
    a materialized dataset needs no tasks, and an autoscaling cluster may add a node.
    """
    free = ray.available_resources().get("CPU", 0.0)
    if free < 1.0:
        total = ray.cluster_resources().get("CPU", 0.0)
        logger.warning(
            "Dataset(s) %s: the workers hold %.4g of the cluster's %.4g CPUs, leaving %.4g for Ray Data's read "
            "and map tasks, which need 1 each: unless the dataset is materialized or a node joins, the shards "
            "will produce nothing and training will wait. Give each worker fewer CPUs "
            "(ScalingConfig(resources_per_worker={'CPU': ...})), fewer workers, or Ray more CPUs "
            "(ray.init(num_cpus=...) or a bigger cluster).",
            ", ".join(repr(n) for n in names),
            total - free,
            total,
            free,
        )
