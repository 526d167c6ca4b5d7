"""What ``DataParallelTrainer.fit()`` does once the run folder is leased: open the run, start Ray and the workers,
run the controller, close the run. Driver only."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainlib._internal.execution.controller import Controller
from trainlib._internal.execution.group_data import GroupData
from trainlib._internal.execution.local_mode import fit_in_this_process
from trainlib._internal.execution.monitor import ScalingPolicy
from trainlib._internal.execution.placement import available_workers
from trainlib._internal.execution.run import RestoreExtras, close_run, open_run, start_run
from trainlib._internal.execution.worker_group import RayWorkerGroup
from trainlib._internal.startup.embedded_ray import ensure_ray, note_fit_ended
from trainlib._internal.startup.worker_preload import WORKER_MODULE
from trainlib._internal.storage.lease import RunLease
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.callbacks import ReportRecord, RunInfo
from trainlib.errors import ControllerError, TrainlibError
from trainlib.result import Result

if TYPE_CHECKING:
    from trainlib.data_parallel_trainer import DataParallelTrainer

logger = logging.getLogger("trainlib")


def run_fit(trainer: DataParallelTrainer, storage: RunStorage, lease: RunLease) -> Result:
    """``trainer.fit()`` on its opened run folder, holding its lease: the run opened or continued, Ray started if
    needed, the controller run, the run closed. Driver only."""
    rc = trainer.run_config
    recorded_config = recorded_config_of(trainer)
    run = open_run(
        rc,
        storage.name,
        restoring=trainer._restoring,
        train_fn=trainer._train_fn,
        train_loop_config=recorded_config,
        scaling_config=trainer.scaling_config,
        storage=storage,
        extras=RestoreExtras(
            dataset_config=trainer.dataset_config,
            dataset_names=tuple(sorted(trainer.datasets or {})),
            metadata=trainer.metadata,
        ),
    )
    start_from = (
        storage.uri(run.committed[-1].path)
        if run.committed
        else (trainer.resume_from_checkpoint.uri if trainer.resume_from_checkpoint else None)
    )
    run_info = RunInfo(
        name=storage.name,
        path=storage.uri(),
        world_size=max(1, trainer.scaling_config.max_workers),
        use_gpu=trainer.scaling_config.use_gpu,
        train_loop_config=recorded_config,
        scaling_config=run.record.scaling_config,
        resumed_from=start_from,
        record=run.record,
        earlier_reports=tuple(
            ReportRecord(
                step=row["step"],
                metrics=row["metrics"],
                checkpoint=None,
                attempt=row.get("attempt", 0),
                reported_at=row.get("time", 0.0),
            )
            for row in run.metrics_rows
        ),
    )
    if trainer.scaling_config.local_mode:
        return fit_in_this_process(trainer, run, run_info, lease)
    import ray

    policy = ScalingPolicy(trainer.scaling_config, available_workers)
    data = GroupData(metadata=trainer.metadata, datasets=trainer.datasets, data_config=trainer.dataset_config)
    # Put once per run: every worker of every attempt reads this copy.
    train_fn_ref = ray.put(trainer._train_fn) if ray.is_initialized() else None

    def new_group() -> RayWorkerGroup:
        return RayWorkerGroup(
            trainer.scaling_config,
            trainer.backend,
            train_fn_ref,
            policy.num_workers(),
            data,
            trainer._train_fn,
            runtime_env=rc.worker_runtime_env,
        )

    # Ray already up (a cluster, the pipeline's task runner, an earlier fit()): the first attempt's workers
    # start, and import their framework, while the callbacks' before_run runs (MLflow's: 1-3 s).
    early = submit_early(new_group) if train_fn_ref is not None else []
    try:
        start_run(run, run_info, rc.callbacks)
        # Else Ray starts after the storage and tracking checks, which fail in seconds without it.
        ensure_ray(preload=(*trainer.backend.preload_modules, WORKER_MODULE))
        if train_fn_ref is None:
            train_fn_ref = ray.put(trainer._train_fn)
        if start_from:
            logger.info("Run %s resumes from %s", storage.name, start_from)
        controller = Controller(
            storage=storage,
            make_worker_group=lambda: early.pop() if early else new_group(),
            checkpoint_config=rc.checkpoint_config,
            failure_config=rc.failure_config,
            callbacks=rc.callbacks,
            run_info=run_info,
            start_checkpoint=trainer.resume_from_checkpoint,
            metrics_rows=run.metrics_rows,
            committed=run.committed,
            verbose=rc.verbose,
            scaling_policy=policy,
            metadata=trainer.metadata,
            lease=lease,
        )
    except BaseException:  # the run stopped before its first attempt (before_run raised): nothing may keep running
        for group in early:
            group.shutdown()
        raise
    try:
        controller.run()
    except Exception as exc:
        # A driver-side bug or outage is Ray Train's ControllerError; trainlib's own errors pass as they are.
        error = exc if isinstance(exc, TrainlibError) else ControllerError(exc)
        close_run(run, rc, run_info, controller, error)
        raise error from (None if error is exc else exc)
    except BaseException as exc:  # KeyboardInterrupt: record the run as failed, and stop
        close_run(run, rc, run_info, controller, exc)
        raise
    finally:
        note_fit_ended()
    return close_run(run, rc, run_info, controller, None)


def recorded_config_of(trainer: DataParallelTrainer) -> dict | None:
    """The config as the run record and the callbacks get it: as given, or, when it cannot be pickled (local
    mode), with each value that cannot be pickled named by its type."""
    if trainer._train_fn is not None or not trainer.train_loop_config:
        return trainer.train_loop_config
    return {k: v if picklable(v) else f"<{type(v).__name__}>" for k, v in trainer.train_loop_config.items()}


def submit_early(new_group: Callable[[], RayWorkerGroup]) -> list[RayWorkerGroup]:
    """The first attempt's group with its actors asked for; none when the request can never fit (the
    attempt raises that as it starts, after the callbacks' before_run, as without an early start)."""
    group = new_group()
    try:
        group.submit_actors()
    except TrainlibError:
        group.shutdown()
        return []
    return [group]


def picklable(value: Any) -> bool:
    """Whether Ray can pickle ``value`` (a training config value kept in the run record)."""
    from ray import cloudpickle

    try:
        cloudpickle.dumps(value)
        return True
    except Exception:  # noqa: BLE001 - any pickling failure
        return False
