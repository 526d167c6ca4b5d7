"""``ScalingConfig``: how many workers a run has and what each one holds. Built on the driver, read by workers.

It validates itself on construction and raises ``ValueError`` or ``TypeError`` naming the field, the bad
value and the fix, so bad input fails before any process starts.
"""

from __future__ import annotations

import dataclasses

from trainlib._internal.util.validation import require_number

_PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"  # Ray's node resource per accelerator model


@dataclasses.dataclass
class ScalingConfig:
    """How many workers to run and what each one holds.

    Args:
        num_workers: number of training workers (one process each, one rank each); ``0`` is
            Ray Train's local mode: the function runs in the calling process, without Ray, as
            rank 0 of 1, its reports committed to the run folder as usual, failures not retried;
            or a ``(min_workers, max_workers)`` tuple for elastic training: the
            group starts with as many workers as the cluster can hold now (at
            least ``min_workers``), restarts from the latest checkpoint with fewer
            when a node is lost, and grows (a restart from the latest checkpoint)
            when room for more appears, checked every ``elastic_resize_monitor_interval_s``.
        use_gpu: give each worker one GPU (unless ``resources_per_worker`` says
            otherwise) and use the nccl backend.
        resources_per_worker: Ray resources per worker, e.g. ``{"CPU": 2, "GPU": 1}``.
            Defaults to 1 CPU (plus 1 GPU with ``use_gpu``).
        placement_strategy: Ray placement-group strategy: PACK, SPREAD,
            STRICT_PACK or STRICT_SPREAD.
        placement_timeout_s: how long to wait for the cluster to grant the
            workers' resources (``min_workers`` of them when elastic) before
            failing. A request the cluster can never hold fails at once, without waiting.
        elastic_resize_monitor_interval_s: with elastic ``num_workers``, how often a
            run below ``max_workers`` checks whether the cluster has room for more.
        accelerator_type: put the workers on nodes with this accelerator, e.g. ``"A100"`` or
            ``"H100"`` (Ray's ``accelerator_type:<type>`` node resource, as in Ray Train).
        label_selector: put the workers on nodes with these Ray node labels, as in Ray Train: one
            dict for every worker (``{"zone": "us-west-2a"}``; Ray's operators work: ``"!spot"``,
            ``"in(a,b)"``), or a list of ``max_workers`` dicts, one per worker.

    Example:
        >>> ScalingConfig(num_workers=2, use_gpu=False)
        >>> ScalingConfig(num_workers=(1, 4))  # elastic: 1 to 4 workers
    """

    num_workers: int | tuple[int, int] = 1
    use_gpu: bool = False
    resources_per_worker: dict[str, float] | None = None
    placement_strategy: str = "PACK"
    placement_timeout_s: float = 120.0
    elastic_resize_monitor_interval_s: float = 60.0
    accelerator_type: str | None = None
    label_selector: dict[str, str] | list[dict[str, str]] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.num_workers, list):
            self.num_workers = tuple(self.num_workers)  # a tuple that went through JSON
        counts = self.num_workers if isinstance(self.num_workers, tuple) else (self.num_workers,)
        if len(counts) not in (1, 2) or any(isinstance(n, bool) or not isinstance(n, int) for n in counts):
            raise TypeError(
                f"ScalingConfig.num_workers must be an int or a (min_workers, max_workers) tuple of ints, got "
                f"{self.num_workers!r}: e.g. ScalingConfig(num_workers=2) or ScalingConfig(num_workers=(1, 4))."
            )
        # 0 alone is local mode (local_mode.py): the function runs in the calling process, without Ray.
        if counts != (0,) and min(counts) < 1:
            raise ValueError(
                f"ScalingConfig.num_workers={self.num_workers} is invalid: at least 1 worker is needed, e.g. "
                "ScalingConfig(num_workers=2), or num_workers=0 to run the function in this process (local mode)."
            )
        if len(counts) == 2 and counts[0] > counts[1]:
            raise ValueError(
                f"ScalingConfig.num_workers={self.num_workers} is invalid: min_workers={counts[0]} must be <= "
                f"max_workers={counts[1]}, e.g. num_workers=(1, 4)."
            )
        require_number(
            "ScalingConfig",
            "elastic_resize_monitor_interval_s",
            self.elastic_resize_monitor_interval_s,
            minimum=0,
            fix="use a non-negative number of seconds, e.g. 60.",
        )
        if not isinstance(self.use_gpu, bool):
            raise TypeError(f"ScalingConfig.use_gpu must be True or False, got {self.use_gpu!r}.")
        if self.resources_per_worker is not None:
            if not isinstance(self.resources_per_worker, dict):
                raise TypeError(
                    "ScalingConfig.resources_per_worker must be a dict such as "
                    f"{{'CPU': 2, 'GPU': 1}}, got {self.resources_per_worker!r}."
                )
            for key, amount in self.resources_per_worker.items():
                if not isinstance(key, str):
                    raise TypeError(f"ScalingConfig.resources_per_worker keys must be resource names, got {key!r}.")
                require_number(
                    "ScalingConfig",
                    f"resources_per_worker[{key!r}]",
                    amount,
                    minimum=0,
                    fix="use a non-negative amount, e.g. {'CPU': 1}.",
                )
            if self.resources_per_worker.get("GPU", 0) > 0 and not self.use_gpu:
                raise ValueError(
                    f"ScalingConfig.resources_per_worker asks for GPUs ({self.resources_per_worker}) "
                    "but use_gpu=False: set use_gpu=True, or drop 'GPU' from resources_per_worker."
                )
        if self.placement_strategy not in _PLACEMENT_STRATEGIES:
            raise ValueError(
                f"ScalingConfig.placement_strategy={self.placement_strategy!r} is invalid: use one of "
                f"{', '.join(_PLACEMENT_STRATEGIES)}."
            )
        require_number(
            "ScalingConfig",
            "placement_timeout_s",
            self.placement_timeout_s,
            minimum=0.1,
            fix="use a positive number of seconds, e.g. 120.",
        )
        if self.accelerator_type is not None and (
            not isinstance(self.accelerator_type, str) or not self.accelerator_type.strip()
        ):
            raise TypeError(
                f"ScalingConfig.accelerator_type must be an accelerator's name such as 'A100' or 'H100', "
                f"got {self.accelerator_type!r}."
            )
        if self.label_selector is not None:
            selectors = self.label_selector if isinstance(self.label_selector, list) else [self.label_selector]
            if not all(
                isinstance(s, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in s.items())
                for s in selectors
            ):
                raise TypeError(
                    f"ScalingConfig.label_selector must be a dict of node label -> value strings, e.g. "
                    f"{{'zone': 'us-west-2a'}}, or a list of them (one per worker), got {self.label_selector!r}."
                )
            if isinstance(self.label_selector, list) and len(self.label_selector) != self.max_workers:
                raise ValueError(
                    f"ScalingConfig.label_selector is a list of {len(self.label_selector)} selectors for "
                    f"{self.max_workers} workers: give one per worker (max_workers), or one dict for all."
                )

    @property
    def local_mode(self) -> bool:
        """Whether the function runs in the calling process (``num_workers=0``, Ray Train's local mode)."""
        return self.num_workers == 0

    @property
    def elasticity_enabled(self) -> bool:
        """Whether ``num_workers`` is a ``(min, max)`` range."""
        return isinstance(self.num_workers, tuple)

    @property
    def min_workers(self) -> int:
        """The fewest workers the run trains with."""
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        """The most workers the run trains with."""
        return self.num_workers[1] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def worker_resources(self) -> dict[str, float]:
        """The Ray resources one worker reserves (CPU and GPU included)."""
        resources = dict(self.resources_per_worker or {})
        resources.setdefault("CPU", 1)
        if self.use_gpu:
            resources.setdefault("GPU", 1)
        if self.accelerator_type:
            # A sliver of the resource Ray gives each node with that accelerator (Ray Train asks the same).
            resources.setdefault(ACCELERATOR_RESOURCE_PREFIX + self.accelerator_type, 0.001)
        return {k: float(v) for k, v in resources.items() if v}

    @property
    def num_cpus_per_worker(self) -> float:
        """CPUs each worker reserves (Ray Train's property)."""
        return self.worker_resources.get("CPU", 0.0)

    @property
    def num_gpus_per_worker(self) -> float:
        """GPUs each worker reserves (Ray Train's property)."""
        return self.worker_resources.get("GPU", 0.0)

    @property
    def additional_resources_per_worker(self) -> dict[str, float]:
        """Each worker's resources other than CPUs and GPUs (Ray Train's property)."""
        return {k: v for k, v in self.worker_resources.items() if k not in ("CPU", "GPU")}

    def label_selectors(self, num_workers: int) -> list[dict[str, str]] | None:
        """Each worker's node-label selector in a group of ``num_workers`` (Ray's ``bundle_label_selector``)."""
        if self.label_selector is None:
            return None
        if isinstance(self.label_selector, list):
            return [dict(s) for s in self.label_selector[:num_workers]]
        return [dict(self.label_selector) for _ in range(num_workers)]

    @property
    def total_resources(self) -> dict[str, float]:
        """The Ray resources the whole worker group reserves (at its largest, when elastic)."""
        return {k: v * self.max_workers for k, v in self.worker_resources.items()}
