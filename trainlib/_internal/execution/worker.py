"""The training worker: one Ray actor per rank. Runs in worker actors only.

The driver creates the actor (it warms up: imports the backend, sets threads),
asks where it landed (``describe``), then calls ``start`` with one ``WorkerStart``.
``start`` returns at once; the user's training function runs in a thread of the
actor, and the driver receives its reports through ``next_messages``, a
blocking call, so the driver waits on events rather than polling.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
from typing import Any

from trainlib._internal.execution import user_code
from trainlib._internal.execution.messages import WorkerMessage, drained
from trainlib._internal.execution.session import WorkerSession, set_session
from trainlib._internal.execution.spec import Placement, WorkerInfo, WorkerStart
from trainlib._internal.execution.train_fn import TrainFunction, extend_sys_path
from trainlib._internal.startup.bulk_imports import collector_paused

_WAKE = object()  # put by flush(): ends a next_messages() blocked on an empty outbox; never sent


class WorkerBackend:
    """What a framework does around the user's function in each worker (see trainlib.torch).

    ``preload_modules``: what its workers import anyway, which an embedded Ray's workers import as they
    start (before the actors exist); a backend without a framework preloads nothing.
    """

    preload_modules: tuple[str, ...] = ()

    def on_actor_start(self, num_cpus: float) -> None:
        """Warm up in the new actor process (imports, thread counts)."""

    def open_rendezvous(self, host: str, world_size: int) -> int:
        """In rank 0's actor, before any rank starts: the port every rank is given as ``MASTER_PORT``.

        ``host``: this node's address, the one the other ranks are given as ``MASTER_ADDR``.
        A backend with a rendezvous of its own opens it here; the default picks a free port.
        """
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def on_start(self, info: WorkerInfo) -> Any:
        """Before the training function: join the process group, pick the device; return the device (or None)."""
        return None

    def on_shutdown(self) -> None:
        """After the training function returns."""


class TrainWorker:
    """One training rank. Wrapped with ``ray.remote`` by the driver."""

    def __init__(self, backend: WorkerBackend, num_cpus: float, env: dict[str, str]):
        os.environ.update(env)
        self.backend = backend
        with collector_paused():  # on a cluster, where nothing was preloaded, it imports the framework
            self.backend.on_actor_start(num_cpus)
        self.outbox: queue.Queue[WorkerMessage] = queue.Queue()
        self.session: WorkerSession | None = None

    def describe(self) -> Placement:
        """Where this actor runs: node, address, pid, GPUs."""
        import ray

        ctx = ray.get_runtime_context()
        accelerators = ctx.get_accelerator_ids() if hasattr(ctx, "get_accelerator_ids") else {}
        return Placement(
            node_id=ctx.get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            hostname=socket.gethostname(),
            pid=os.getpid(),
            gpu_ids=tuple(str(g) for g in accelerators.get("GPU", [])),
        )

    def missing_modules(self, names: list[str], driver_sys_path: list[str]) -> list[str]:
        """Of the user's modules ``names``, those this worker cannot import (the driver ships them by value)."""
        extend_sys_path(driver_sys_path)
        return user_code.missing_modules(names)

    def open_rendezvous(self, world_size: int) -> int:
        """Called on rank 0's actor before ``start``: the backend's rendezvous port on this node."""
        import ray

        return self.backend.open_rendezvous(ray.util.get_node_ip_address(), world_size)

    def start(self, start: WorkerStart) -> None:
        """Start the training function in a thread and return."""
        # For code that reads torchrun's variables (RANK, LOCAL_RANK...) and for CUDA: trainlib
        # itself reads the rank and device from the session.
        os.environ.update(start.env)
        self.session = WorkerSession(
            start.info, start.attempt, self.outbox, metadata=start.metadata, dataset_shards=start.dataset_shards
        )
        thread = threading.Thread(target=self._run, args=(start.train_fn,), name="trainlib-train", daemon=True)
        thread.start()

    def _run(self, train_fn: Any) -> None:
        assert self.session is not None
        set_session(self.session)
        _train_at_node_priority()
        try:
            if not isinstance(train_fn, TrainFunction):
                import ray

                train_fn = ray.get(train_fn)  # the driver put it once into the object store
            with collector_paused():  # unpickling it imports the user's modules (torchvision: ~1 s)
                call = train_fn.load()
            self.session.device = self.backend.on_start(self.session.info)
            value = call()
            self.backend.on_shutdown()
        except BaseException as exc:  # noqa: BLE001 - every failure goes to the driver
            self.session.finish(exc)
        else:
            self.session.finish(return_value=value)

    def mark_preempted(self, info: Any) -> None:
        """The driver saw a node of this run draining: ``get_preemption_info()`` returns ``info`` from now on."""
        if self.session is not None:
            self.session.preemption = info

    def next_messages(self) -> list[WorkerMessage]:
        """Block until this worker has something for the driver (or flush() woke it); return all of it, in order."""
        return [m for m in drained(self.outbox, [self.outbox.get()]) if m is not _WAKE]

    def close(self) -> None:
        """Before the group is torn down: remove this worker's staging folder."""
        if self.session is not None:
            self.session.close()

    def flush(self, timeout: float) -> list[WorkerMessage]:
        """After another rank failed: let pending uploads finish, then return what is queued."""
        if self.session is not None:
            self.session.wait_uploads(timeout)
        messages = [m for m in drained(self.outbox, []) if m is not _WAKE]
        # A next_messages() call of the driver's may be blocked on the emptied queue, or hold messages taken just
        # before this drain: wake it, so the driver can wait for its answer instead of dropping it.
        self.outbox.put(_WAKE)
        return messages


def _train_at_node_priority() -> None:
    """Give this worker's threads the Ray node's CPU priority instead of Ray's worker niceness (15).

    Ray starts its worker processes niced, so a training rank loses the CPU to every other
    process on the machine (Ray's own daemons included) and, on a busy node, trains far slower
    than a torchrun rank. Called in the training thread: the threads
    it starts (OpenMP, gloo, data loading) inherit its priority. Lowering niceness needs root or
    CAP_SYS_NICE; without them the worker stays as Ray set it.
    """
    try:
        target = os.getpriority(os.PRIO_PROCESS, os.getppid())  # the raylet, which started this worker
        if os.getpriority(os.PRIO_PROCESS, 0) <= target:
            return
        os.setpriority(os.PRIO_PROCESS, 0, target)  # this thread (on Linux niceness is per thread)
        others = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []
    except OSError:
        return  # not permitted: train at Ray's niceness
    for tid in others:  # the actor's other threads (Ray's RPC threads, the checkpoint uploader)
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), target)
        except OSError:
            pass  # a thread that has just exited
