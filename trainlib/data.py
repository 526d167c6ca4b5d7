"""``DataConfig``: how Ray Data datasets reach the workers. Built on the driver; shards are read in workers.

``TorchTrainer(datasets={"train": ds}, dataset_config=DataConfig(...))`` gives
every worker its part of each dataset, as a ``ray.data.DataIterator`` that
``trainlib.get_dataset_shard("train")`` returns inside the training function.
The split is Ray Data's own ``Dataset.streaming_split``: blocks stream from the
Ray Data executor (preprocessing on any node's CPUs) into the workers while
they train, so a dataset larger than a worker's memory trains; each pass over
the shard (an epoch) re-executes the dataset and gives each worker its own
disjoint part of it.

Example:
    >>> ds = ray.data.read_parquet("s3://bucket/train").map_batches(preprocess)
    >>> trainer = TorchTrainer(train_func, datasets={"train": ds}, scaling_config=ScalingConfig(num_workers=4))
    >>> # in train_func: for batch in trainlib.get_dataset_shard("train").iter_torch_batches(batch_size=256): ...
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Literal

TRAIN_DATASET_KEY = "train"  # Ray Train's conventional name of the training dataset

if TYPE_CHECKING:
    from ray.data import DataIterator, Dataset, ExecutionOptions


class DataConfig:
    """Which datasets are split among the workers, and the Ray Data options their shards run with.

    Subclass it and override :meth:`configure` to assign datasets differently.

    Args:
        datasets_to_split: ``"all"`` (default), or the names of the datasets to
            split; the other datasets reach every worker whole.
        execution_options: ``ray.data.ExecutionOptions`` for every dataset, or a
            dict of them by dataset name; None uses :meth:`default_ingest_options`.
        enable_shard_locality: give each worker the blocks already on its node
            where possible (less cross-node traffic).
    """

    def __init__(
        self,
        datasets_to_split: Literal["all"] | list[str] = "all",
        execution_options: ExecutionOptions | dict[str, ExecutionOptions] | None = None,
        enable_shard_locality: bool = True,
    ):
        if not (
            datasets_to_split == "all"
            or (isinstance(datasets_to_split, list) and all(isinstance(n, str) for n in datasets_to_split))
        ):
            raise TypeError(
                f"DataConfig(datasets_to_split={datasets_to_split!r}) is invalid: use 'all' or a list of "
                "dataset names, e.g. ['train']."
            )
        if not isinstance(enable_shard_locality, bool):
            raise TypeError(f"DataConfig(enable_shard_locality={enable_shard_locality!r}) must be True or False.")
        self._datasets_to_split = datasets_to_split
        self._execution_options = execution_options
        self._enable_shard_locality = enable_shard_locality

    def configure(
        self,
        datasets: dict[str, Dataset],
        world_size: int,
        worker_handles: list[Any] | None,
        worker_node_ids: list[str] | None,
        **kwargs: Any,
    ) -> list[dict[str, DataIterator]]:
        """Assign the datasets to the workers of a newly started group; called by the driver per attempt.

        Returns:
            One dict per rank, dataset name -> the ``DataIterator`` that rank reads.
        """
        output: list[dict[str, DataIterator]] = [{} for _ in range(world_size)]
        split = set(datasets) if self._datasets_to_split == "all" else set(self._datasets_to_split)
        hints = worker_node_ids if self._enable_shard_locality else None
        for name, dataset in datasets.items():
            dataset = dataset.copy(dataset)  # our options must not change the user's dataset
            dataset.context.execution_options = self._options_for(name)
            if dataset.name is None:
                dataset.set_name(name)
            if name in split:
                for rank, shard in enumerate(dataset.streaming_split(world_size, equal=True, locality_hints=hints)):
                    output[rank][name] = shard
            else:
                for rank in range(world_size):
                    output[rank][name] = dataset.iterator()
        return output

    def _options_for(self, name: str) -> ExecutionOptions:
        options = self._execution_options
        if isinstance(options, dict):
            options = options.get(name)
        return copy.deepcopy(options or self.default_ingest_options())

    @staticmethod
    def default_ingest_options() -> ExecutionOptions:
        """The driver's current Ray Data execution options (limits, order, progress)."""
        from ray.data import ExecutionOptions
        from ray.data.context import DataContext

        current = DataContext.get_current().execution_options
        return ExecutionOptions(
            resource_limits=current.resource_limits,
            exclude_resources=current.exclude_resources,
            preserve_order=current.preserve_order,
            verbose_progress=current.verbose_progress,
        )

    def __repr__(self) -> str:
        return (
            f"DataConfig(datasets_to_split={self._datasets_to_split!r}, "
            f"enable_shard_locality={self._enable_shard_locality})"
        )


def check_datasets(datasets: Any, dataset_config: Any) -> None:
    """Validate ``TorchTrainer(datasets=..., dataset_config=...)`` on the driver, before anything starts."""
    if dataset_config is not None and not isinstance(dataset_config, DataConfig):
        raise TypeError(f"dataset_config must be a trainlib.DataConfig, got {type(dataset_config).__name__}.")
    if datasets is None:
        return
    if not isinstance(datasets, dict):
        raise TypeError(
            f"datasets must be a dict of name -> ray.data.Dataset, got {type(datasets).__name__}: "
            "e.g. datasets={'train': ray.data.read_parquet(...)}."
        )
    from ray.data import Dataset

    for name, dataset in datasets.items():
        if not isinstance(name, str):
            raise TypeError(f"datasets keys must be dataset names (str), got {name!r}.")
        if not isinstance(dataset, Dataset) and not callable(dataset):
            raise TypeError(
                f"datasets[{name!r}] is {type(dataset).__name__}, not a ray.data.Dataset (or a function "
                "returning one): build it with ray.data (from_numpy, read_parquet, range, ...)."
            )
    if dataset_config is not None and dataset_config._datasets_to_split != "all":
        missing = set(dataset_config._datasets_to_split) - set(datasets)
        if missing:
            raise ValueError(
                f"DataConfig(datasets_to_split=...) names {sorted(missing)}, which are not in datasets "
                f"({sorted(datasets)}): pass those datasets or drop the names."
            )
