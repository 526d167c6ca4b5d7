"""``ScalingConfig``, ``RunConfig``, ``CheckpointConfig``, ``FailureConfig``. Built on the driver, read by workers.

Each config validates itself on construction and raises ``ValueError`` or
``TypeError`` naming the field, the bad value and the fix, so bad input fails
before any process starts.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Literal

from trainlib._internal import tunables

MAX_RUN_NAME_LENGTH = 200
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
ACCELERATOR_RESOURCE_PREFIX = "accelerator_type:"  # Ray's node resource per accelerator model


def _require_number(owner: str, field: str, value: Any, *, minimum: float, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}.{field} must be a number, got {value!r} ({type(value).__name__}). {fix}")
    if value < minimum:
        raise ValueError(f"{owner}.{field}={value!r} is invalid: {fix}")


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
        _require_number("ScalingConfig", "elastic_resize_monitor_interval_s", self.elastic_resize_monitor_interval_s,
                        minimum=0, fix="use a non-negative number of seconds, e.g. 60.")
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
                _require_number("ScalingConfig", f"resources_per_worker[{key!r}]", amount, minimum=0,
                                fix="use a non-negative amount, e.g. {'CPU': 1}.")
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
        _require_number("ScalingConfig", "placement_timeout_s", self.placement_timeout_s, minimum=0.1,
                        fix="use a positive number of seconds, e.g. 120.")
        if self.accelerator_type is not None and (not isinstance(self.accelerator_type, str)
                                                  or not self.accelerator_type.strip()):
            raise TypeError(f"ScalingConfig.accelerator_type must be an accelerator's name such as 'A100' or 'H100', "
                            f"got {self.accelerator_type!r}.")
        if self.label_selector is not None:
            selectors = self.label_selector if isinstance(self.label_selector, list) else [self.label_selector]
            if not all(isinstance(s, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in s.items())
                       for s in selectors):
                raise TypeError(f"ScalingConfig.label_selector must be a dict of node label -> value strings, e.g. "
                                f"{{'zone': 'us-west-2a'}}, or a list of them (one per worker), got {self.label_selector!r}.")
            if isinstance(self.label_selector, list) and len(self.label_selector) != self.max_workers:
                raise ValueError(f"ScalingConfig.label_selector is a list of {len(self.label_selector)} selectors for "
                                 f"{self.max_workers} workers: give one per worker (max_workers), or one dict for all.")

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


@dataclasses.dataclass
class CheckpointConfig:
    """Which committed checkpoints to keep.

    Args:
        num_to_keep: keep this many checkpoints, the best ones (``None`` keeps all).
            While the run is unfinished (running, or failed) the latest
            checkpoint is kept as well, so that the run can resume, even when it
            is not one of the best; it is not listed in ``Result.best_checkpoints``
            and it is deleted when the run finishes, so a finished run holds
            exactly ``num_to_keep`` checkpoints.
        checkpoint_score_attribute: the reported metric that ranks checkpoints (a ``/`` path
            reaches into nested metrics, as in Ray Train: ``"val/loss"``);
            ``None`` ranks them by recency (keep the latest N).
        checkpoint_score_order: ``"max"`` (higher is better) or ``"min"``.

    Example:
        >>> CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="accuracy")
    """

    num_to_keep: int | None = None
    checkpoint_score_attribute: str | None = None
    checkpoint_score_order: Literal["max", "min"] = "max"

    def __post_init__(self) -> None:
        if self.num_to_keep is not None:
            if isinstance(self.num_to_keep, bool) or not isinstance(self.num_to_keep, int) or self.num_to_keep < 1:
                raise ValueError(
                    f"CheckpointConfig.num_to_keep={self.num_to_keep!r} is invalid: use a positive int, "
                    "or None to keep every checkpoint."
                )
        if self.checkpoint_score_attribute is not None and not isinstance(self.checkpoint_score_attribute, str):
            raise TypeError(
                "CheckpointConfig.checkpoint_score_attribute must be the name of a reported metric, "
                f"got {self.checkpoint_score_attribute!r}."
            )
        if self.checkpoint_score_order not in ("max", "min"):
            raise ValueError(
                f"CheckpointConfig.checkpoint_score_order={self.checkpoint_score_order!r} is invalid: "
                "use 'max' (higher is better) or 'min'."
            )


@dataclasses.dataclass
class FailureConfig:
    """How many times a failed worker group is restarted, and how long a straggling rank is waited for.

    Args:
        max_failures: restarts allowed from the latest committed checkpoint
            after a worker raises or dies; 0 fails at the first failure, -1
            restarts without limit.
        straggler_timeout_s: once a rank's training function returned, how long
            the other ranks may still run: a warning names them at half of it,
            then the attempt fails (a failure like any other). ``None`` waits
            without a bound. Default 1800 s.
        max_preemption_failures: restarts allowed, counted apart from
            ``max_failures``, when the failure is a node preemption (a node that
            Ray was draining, e.g. a spot instance being reclaimed); -1 (default)
            restarts without limit, 0 treats preemptions as ordinary failures.

    Example:
        >>> FailureConfig(max_failures=2, straggler_timeout_s=600)
    """

    max_failures: int = 0
    straggler_timeout_s: float | None = tunables.DEFAULT_STRAGGLER_TIMEOUT_S
    max_preemption_failures: int = -1

    def __post_init__(self) -> None:
        if isinstance(self.max_failures, bool) or not isinstance(self.max_failures, int) or self.max_failures < -1:
            raise ValueError(
                f"FailureConfig.max_failures={self.max_failures!r} is invalid: use 0 (no restarts), "
                "a positive int, or -1 for unlimited restarts."
            )
        if self.straggler_timeout_s is not None:
            _require_number("FailureConfig", "straggler_timeout_s", self.straggler_timeout_s, minimum=0.1,
                            fix="use a positive number of seconds (e.g. 600), or None to wait without a bound.")
        if (isinstance(self.max_preemption_failures, bool) or not isinstance(self.max_preemption_failures, int)
                or self.max_preemption_failures < -1):
            raise ValueError(
                f"FailureConfig.max_preemption_failures={self.max_preemption_failures!r} is invalid: use -1 "
                "(unlimited, the default), 0 (count preemptions as failures) or a positive int."
            )


IF_EXISTS_CHOICES = ("resume", "overwrite", "error")


@dataclasses.dataclass
class RunConfig:
    """Where a run keeps its results and how it behaves.

    Args:
        name: the run's folder name under ``storage_path``. Defaults to a new
            unique name, so runs never clash by accident.
        storage_path: a local folder or any fsspec URL (``s3://bucket/prefix``,
            ``file:///mnt/nfs/runs``). Defaults to ``~/trainlib_results``. With
            more than one node it must be shared storage.
        storage_filesystem: an ``fsspec`` filesystem to use instead of the one
            the URL implies.
        storage_options: keyword arguments for the fsspec filesystem (endpoint,
            credentials, ...). Never logged or written to storage.
        checkpoint_config: checkpoint retention, see :class:`CheckpointConfig`.
        failure_config: restarts on failure, see :class:`FailureConfig`.
        callbacks: driver-side callbacks (for instance ``trainlib.mlflow.MLflowLogger``).
        if_exists: what to do when ``storage_path/name`` holds a run already.
            ``"resume"`` (default) continues an unfinished run from its latest
            committed checkpoint and refuses a finished one; ``"overwrite"``
            deletes the old run first; ``"error"`` refuses any existing run.
        verbose: print a line per report and per restart on the driver.
        worker_runtime_env: a Ray runtime environment for the worker actors, as in Ray Train
            (e.g. ``{"env_vars": {"NCCL_DEBUG": "INFO"}, "pip": [...]}``), on top of the
            one given to ``ray.init``. Its ``env_vars`` win over trainlib's own (``OMP_NUM_THREADS``).
            Never logged or written to storage.

    Example:
        >>> RunConfig(name="fashion", storage_path="s3://bucket/runs")
    """

    name: str | None = None
    storage_path: str | os.PathLike | None = None
    storage_filesystem: Any = None
    storage_options: dict[str, Any] | None = dataclasses.field(default=None, repr=False)
    checkpoint_config: CheckpointConfig | None = None
    failure_config: FailureConfig | None = None
    callbacks: list[Any] | None = None
    if_exists: Literal["resume", "overwrite", "error"] = "resume"
    verbose: bool = True
    worker_runtime_env: dict[str, Any] | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not _NAME_PATTERN.match(self.name)):
            raise ValueError(
                f"RunConfig.name={self.name!r} is invalid: use letters, digits, '.', '_' or '-' "
                "(it becomes a folder name), e.g. RunConfig(name='fashion-mnist')."
            )
        if self.name is not None and len(self.name) > MAX_RUN_NAME_LENGTH:
            raise ValueError(
                f"RunConfig.name is {len(self.name)} characters long ({self.name[:40]}...); at most "
                f"{MAX_RUN_NAME_LENGTH} are allowed (it becomes a folder name, and filesystems allow 255 bytes "
                "with the files' suffixes): use a shorter name."
            )
        if self.storage_path is not None and not isinstance(self.storage_path, (str, os.PathLike)):
            raise TypeError(
                f"RunConfig.storage_path must be a path or URL string, got {type(self.storage_path).__name__}."
            )
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise TypeError("RunConfig.storage_options must be a dict of fsspec filesystem options.")
        if self.worker_runtime_env is not None:
            if not isinstance(self.worker_runtime_env, dict):  # ray.runtime_env.RuntimeEnv is a dict
                raise TypeError(f"RunConfig.worker_runtime_env must be a dict (or ray.runtime_env.RuntimeEnv) such "
                                f"as {{'env_vars': {{'NAME': 'value'}}}}, got {type(self.worker_runtime_env).__name__}.")
            env_vars = self.worker_runtime_env.get("env_vars") or {}
            if not isinstance(env_vars, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                         for k, v in env_vars.items()):
                raise TypeError("RunConfig.worker_runtime_env['env_vars'] must map names to strings, e.g. "
                                "{'env_vars': {'OMP_NUM_THREADS': '2'}}: write numbers as strings.")
        self.checkpoint_config = self.checkpoint_config or CheckpointConfig()
        self.failure_config = self.failure_config or FailureConfig()
        if not isinstance(self.checkpoint_config, CheckpointConfig):
            raise TypeError("RunConfig.checkpoint_config must be a trainlib.CheckpointConfig.")
        if not isinstance(self.failure_config, FailureConfig):
            raise TypeError("RunConfig.failure_config must be a trainlib.FailureConfig.")
        self.callbacks = list(self.callbacks or [])
        if self.if_exists not in IF_EXISTS_CHOICES:
            raise ValueError(
                f"RunConfig.if_exists={self.if_exists!r} is invalid: use one of {', '.join(IF_EXISTS_CHOICES)}."
            )
