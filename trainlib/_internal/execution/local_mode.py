"""Ray Train's local mode, ``ScalingConfig(num_workers=0)``: the training function runs in this process. Driver only.

No Ray starts and no worker process: the function runs in the calling thread (so ``breakpoint()``,
Ctrl-C, profilers and the debugger behave as in a plain script), as rank 0 of 1, with the same
``report``/``get_context``/``get_checkpoint`` as on a worker. Unlike Ray Train's local mode, which only
remembers the last report, its reports are committed to the run folder by the usual controller, in a
helper thread, through a one-rank worker group (:class:`LocalWorkerGroup`): checkpoints, retention,
the metrics log, callbacks (MLflow), ``Result.from_path`` and resuming work as for a distributed run.
A failure is not retried (as in Ray Train's local mode) and is raised as it was raised, after the run
is recorded as failed.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import queue
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainlib._internal.execution.controller import Controller
from trainlib._internal.execution.messages import WorkerMessage, drained
from trainlib._internal.execution.run import OpenedRun, close_run, start_run
from trainlib._internal.execution.session import WorkerSession, set_session
from trainlib._internal.execution.spec import AttemptSpec, Placement, WorkerInfo
from trainlib._internal.execution.train_fn import TrainFunction
from trainlib.callbacks import RunInfo
from trainlib.errors import ControllerError, TrainlibError, WorkerGroupError
from trainlib.result import Result

if TYPE_CHECKING:
    from trainlib.data_parallel_trainer import DataParallelTrainer

logger = logging.getLogger("trainlib")

LOCAL_NODE_ID = "local"
_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def check_not_under_torchrun() -> None:
    """Ray Train's local mode under ``torchrun`` (several processes) is not built: say so before anything runs."""
    if all(v in os.environ for v in _TORCHRUN_VARIABLES) and os.environ["WORLD_SIZE"] not in ("", "1"):
        raise ValueError(
            f"ScalingConfig(num_workers=0) runs the training function in this one process, but this process was "
            f"started by torchrun as rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}: Ray Train's "
            "multi-process local mode is not built in trainlib. Run the script with plain `python` and "
            f"ScalingConfig(num_workers={os.environ['WORLD_SIZE']}), which starts the processes itself."
        )


class LocalWorkerGroup:
    """The one rank of a local-mode run as the controller sees a worker group (``controller.WorkerGroup``).

    Its messages come from the session of the function that the calling thread runs: ``start`` hands
    the attempt to that thread (``next_attempt``) instead of starting a process.
    """

    plan = None  # one rank on this node: no rank layout

    def __init__(self) -> None:
        self.outbox: queue.Queue[WorkerMessage] = queue.Queue()
        self.session: WorkerSession | None = None  # set once the function runs
        self._attempts: queue.Queue[AttemptSpec | None] = queue.Queue()

    # -- the controller's side ---------------------------------------------------

    def start_actors(self) -> None:
        pass

    def placements(self) -> list[Placement]:
        return [Placement(node_id=LOCAL_NODE_ID, node_ip="127.0.0.1", hostname=socket.gethostname(), pid=os.getpid())]

    def start(self, attempt: AttemptSpec) -> None:
        self._attempts.put(attempt)

    def wait(self, timeout: float | None = None) -> list[WorkerMessage]:
        try:
            first = self.outbox.get(timeout=timeout)
        except queue.Empty:
            return []
        return drained(self.outbox, [first])

    def flush(self, timeout: float) -> list[WorkerMessage]:
        if self.session is not None:
            self.session.wait_uploads(timeout)
        return drained(self.outbox, [])

    def shutdown(self) -> None:
        pass

    # -- the training thread's side ----------------------------------------------

    def controller_ended(self) -> None:
        """The controller stopped (finished or failed): a ``next_attempt`` still waiting gets None."""
        self._attempts.put(None)

    def next_attempt(self) -> AttemptSpec | None:
        """The attempt the controller started, or None when it stopped before starting one."""
        return self._attempts.get()


@dataclasses.dataclass(frozen=True)
class LocalOutcome:
    """How a local-mode run ended: the function's return value or exception, and the controller's exception."""

    value: Any = None
    error: BaseException | None = None  # the function's own, KeyboardInterrupt included
    controller_error: BaseException | None = None  # storage, a lost lease, a callback


def run_in_this_process(
    group: LocalWorkerGroup,
    run_controller: Callable[[], None],
    func: Callable[[], Any],
    backend: Any,
    use_gpu: bool,
    metadata: dict[str, Any] | None,
    dataset_shards: dict[str, Any] | None,
) -> LocalOutcome:
    """Run the controller in a helper thread and ``func`` here, as rank 0 of 1.

    The function's own exception, KeyboardInterrupt included, ends its session as a worker failure would; a
    controller that fails (storage, a lost lease) stops the function at its next ``report()``.
    """
    controller_error: list[BaseException] = []

    def drive() -> None:
        try:
            run_controller()
        except BaseException as exc:  # noqa: BLE001 - handed to the calling thread
            controller_error.append(exc)
            if group.session is not None:
                group.session.abort = exc
        finally:
            group.controller_ended()

    thread = threading.Thread(target=drive, name="trainlib-controller", daemon=True)
    thread.start()
    attempt = group.next_attempt()
    if attempt is None:  # the controller failed before the attempt (e.g. storage): nothing ran
        thread.join()
        return LocalOutcome(controller_error=controller_error[0] if controller_error else None)
    info = WorkerInfo(
        world_rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, gpu_index=0 if use_gpu else None
    )
    session = WorkerSession(info, attempt, group.outbox, metadata=metadata, dataset_shards=dataset_shards)
    group.session = session
    if controller_error:  # it failed between handing over the attempt and the line above
        session.abort = controller_error[0]
    set_session(session)
    value, error = None, None
    try:
        session.device = backend.on_start(info)
        value = func()
    except BaseException as exc:  # noqa: BLE001 - raised again by the caller once the run is recorded
        error = exc
        session.finish(exc)
    else:
        session.finish()  # the value stays here: nothing to pickle
    finally:
        set_session(None)
    thread.join()
    return LocalOutcome(value, error, controller_error[0] if controller_error else None)


def fit_in_this_process(trainer: DataParallelTrainer, run: OpenedRun, run_info: RunInfo, lease: Any) -> Result:
    """``trainer.fit()`` in local mode, from its opened run: the function runs here, the controller commits."""
    rc = trainer.run_config
    if rc.failure_config.max_failures != 0:
        logger.warning(
            "ScalingConfig(num_workers=0) runs the function once, in this process, as Ray Train's local "
            "mode does: FailureConfig(max_failures=%d) has no effect. Use num_workers >= 1 for "
            "restarts.",
            rc.failure_config.max_failures,
        )
    group = LocalWorkerGroup()
    start_run(run, run_info, rc.callbacks)
    controller = Controller(
        storage=run.storage,
        make_worker_group=lambda: group,
        checkpoint_config=rc.checkpoint_config,
        failure_config=dataclasses.replace(rc.failure_config, max_failures=0, max_preemption_failures=0),
        callbacks=rc.callbacks,
        run_info=run_info,
        start_checkpoint=trainer.resume_from_checkpoint,
        metrics_rows=run.metrics_rows,
        committed=run.committed,
        verbose=rc.verbose,
        metadata=trainer.metadata,
        lease=lease,
    )
    # One rank reads each dataset whole (Ray Data starts Ray on first use, as it does in Ray Train's local mode).
    shards = {
        name: (ds() if callable(ds) and not hasattr(ds, "streaming_split") else ds).iterator()
        for name, ds in (trainer.datasets or {}).items()
    }
    func = TrainFunction.in_process(trainer.train_loop_per_worker, trainer.train_loop_config)
    try:
        outcome = run_in_this_process(
            group,
            controller.run,
            func,
            trainer.backend,
            trainer.scaling_config.use_gpu,
            trainer.metadata,
            shards or None,
        )
    except BaseException as exc:  # Ctrl-C while the last reports were committed
        close_run(run, rc, run_info, controller, exc)
        raise
    error, controller_error = outcome.error, outcome.controller_error
    if (
        error is not None
        and error is not controller_error
        and (controller_error is None or isinstance(controller_error, WorkerGroupError))
    ):
        close_run(run, rc, run_info, controller, error)
        raise error  # as the function raised it, as Ray Train's local mode does
    if controller_error is not None:
        failure = controller_error if isinstance(controller_error, TrainlibError) else ControllerError(controller_error)
        close_run(run, rc, run_info, controller, failure)
        raise failure from (None if failure is controller_error else controller_error)
    controller.return_value = outcome.value
    return close_run(run, rc, run_info, controller, None)
