"""``RunConfig``, ``CheckpointConfig``, ``FailureConfig`` (and ``ScalingConfig``, from ``scaling.py``). Built on
the driver, read by workers.

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
from trainlib._internal.ray_callbacks import RayUserCallback, is_ray_user_callback
from trainlib._internal.util.validation import require_number

# Defined in scaling.py; importable from here too, as it always was (run folders pickle it under this name).
from trainlib.scaling import ScalingConfig

__all__ = ["CheckpointConfig", "FailureConfig", "RunConfig", "ScalingConfig"]

MAX_RUN_NAME_LENGTH = 200
# '=' too: Ray Train's Tune pattern names runs f"train-trial_id={trial_id}".
_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]*$")


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
        relax_collectives_on_preemption: when the attempt ends because a
            preempted node's workers are gone, commit the reports (and
            just-in-time checkpoints) that every surviving rank made, without
            the preempted ranks' reports, as Ray Train's relaxed report barrier
            does. Ignored (a log line says so) when rank 0 is preempted, as in Ray
            Train. ``trainlib.collective`` calls stay strict. Default False.
        preemption_grace_s: extra seconds the surviving ranks get, after a
            preempted node's workers are gone, to finish uploading the
            checkpoints they reported before the group is torn down. Unlike Ray
            Train, trainlib never stops the survivors at the drain deadline (they
            train until the node is actually lost), so this is the only wait it
            extends. Default 0.

    Example:
        >>> FailureConfig(max_failures=2, straggler_timeout_s=600)
    """

    max_failures: int = 0
    straggler_timeout_s: float | None = tunables.DEFAULT_STRAGGLER_TIMEOUT_S
    max_preemption_failures: int = -1
    relax_collectives_on_preemption: bool = False
    preemption_grace_s: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.max_failures, bool) or not isinstance(self.max_failures, int) or self.max_failures < -1:
            raise ValueError(
                f"FailureConfig.max_failures={self.max_failures!r} is invalid: use 0 (no restarts), "
                "a positive int, or -1 for unlimited restarts."
            )
        if self.straggler_timeout_s is not None:
            require_number(
                "FailureConfig",
                "straggler_timeout_s",
                self.straggler_timeout_s,
                minimum=0.1,
                fix="use a positive number of seconds (e.g. 600), or None to wait without a bound.",
            )
        if (
            isinstance(self.max_preemption_failures, bool)
            or not isinstance(self.max_preemption_failures, int)
            or self.max_preemption_failures < -1
        ):
            raise ValueError(
                f"FailureConfig.max_preemption_failures={self.max_preemption_failures!r} is invalid: use -1 "
                "(unlimited, the default), 0 (count preemptions as failures) or a positive int."
            )
        if not isinstance(self.relax_collectives_on_preemption, bool):
            raise TypeError(
                f"FailureConfig.relax_collectives_on_preemption must be True or False, got "
                f"{self.relax_collectives_on_preemption!r}."
            )
        require_number(
            "FailureConfig",
            "preemption_grace_s",
            self.preemption_grace_s,
            minimum=0,
            fix="use a number of seconds >= 0 (0, the default, adds no wait).",
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
        callbacks: driver-side callbacks (for instance ``trainlib.mlflow.MLflowLogger``); Ray Train v2
            ``UserCallback`` objects (Ray Tune's ``TuneReportCallback``) are called through trainlib's hooks.
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
                f"RunConfig.name={self.name!r} is invalid: use letters, digits, '.', '_', '=' or '-' "
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
                raise TypeError(
                    f"RunConfig.worker_runtime_env must be a dict (or ray.runtime_env.RuntimeEnv) such "
                    f"as {{'env_vars': {{'NAME': 'value'}}}}, got {type(self.worker_runtime_env).__name__}."
                )
            env_vars = self.worker_runtime_env.get("env_vars") or {}
            if not isinstance(env_vars, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()
            ):
                raise TypeError(
                    "RunConfig.worker_runtime_env['env_vars'] must map names to strings, e.g. "
                    "{'env_vars': {'OMP_NUM_THREADS': '2'}}: write numbers as strings."
                )
        self.checkpoint_config = self.checkpoint_config or CheckpointConfig()
        self.failure_config = self.failure_config or FailureConfig()
        if not isinstance(self.checkpoint_config, CheckpointConfig):
            raise TypeError("RunConfig.checkpoint_config must be a trainlib.CheckpointConfig.")
        if not isinstance(self.failure_config, FailureConfig):
            raise TypeError("RunConfig.failure_config must be a trainlib.FailureConfig.")
        self.callbacks = [RayUserCallback(c) if is_ray_user_callback(c) else c for c in self.callbacks or []]
        if self.if_exists not in IF_EXISTS_CHOICES:
            raise ValueError(
                f"RunConfig.if_exists={self.if_exists!r} is invalid: use one of {', '.join(IF_EXISTS_CHOICES)}."
            )
