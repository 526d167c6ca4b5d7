"""The training worker: one Ray actor per rank. Runs in worker actors only.

The driver creates the actor (it warms up: imports the backend, sets threads),
asks where it landed (``describe``), then calls ``start`` with the rank layout.
``start`` returns at once; the user's training function runs in a thread of the
actor, and the driver receives its reports through ``next_messages``, a
blocking call, so the driver waits on events rather than polling.
"""

from __future__ import annotations

import os
import queue
import socket
import sys
import threading
from typing import Any, Callable

from trainlib._internal.execution.session import WorkerSession, set_session
from trainlib._internal.execution.spec import WorkerInfo
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.checkpoint import Checkpoint


class WorkerBackend:
    """What a framework does around the user's function in each worker (see trainlib.torch)."""

    def on_actor_start(self, num_cpus: float) -> None:
        """Warm up in the new actor process (imports, thread counts)."""

    def on_start(self, info: WorkerInfo, master_addr: str, master_port: int) -> None:
        """Before the training function: join the process group, pick the device."""

    def on_shutdown(self) -> None:
        """After the training function returns."""


class TrainWorker:
    """One training rank. Wrapped with ``ray.remote`` by the driver."""

    def __init__(self, backend: WorkerBackend, num_cpus: float, env: dict[str, str]):
        os.environ.update(env)
        self.backend = backend
        self.backend.on_actor_start(num_cpus)
        self.outbox: queue.Queue[tuple] = queue.Queue()
        self.session: WorkerSession | None = None

    def describe(self) -> dict[str, Any]:
        """Where this actor runs: node, address, pid, GPUs."""
        import ray

        ctx = ray.get_runtime_context()
        accelerators = ctx.get_accelerator_ids() if hasattr(ctx, "get_accelerator_ids") else {}
        return {
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "gpu_ids": [str(g) for g in accelerators.get("GPU", [])],
        }

    def find_free_port(self) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    def start(self, train_func: bytes, driver_sys_path: list[str], config: dict | None, info: WorkerInfo,
              storage: RunStorage, checkpoint: Checkpoint | None, first_step: int, master_addr: str,
              master_port: int, env: dict[str, str], metadata: dict[str, Any] | None = None,
              dataset_shards: dict[str, Any] | None = None) -> None:
        """Start the training function (pickled by the driver) in a thread and return."""
        os.environ.update(env)
        self.session = WorkerSession(info, storage, checkpoint, first_step, self.outbox, metadata=metadata,
                                     dataset_shards=dataset_shards)
        thread = threading.Thread(
            target=self._run, args=(train_func, driver_sys_path, config, info, master_addr, master_port),
            name="trainlib-train", daemon=True,
        )
        thread.start()

    def _run(self, train_func_bytes: bytes, driver_sys_path: list[str], config: dict | None, info: WorkerInfo,
             master_addr: str, master_port: int) -> None:
        assert self.session is not None
        set_session(self.session)
        _train_at_node_priority()
        try:
            train_func = _load_train_func(train_func_bytes, driver_sys_path)
            self.backend.on_start(info, master_addr, master_port)
            if config is None:
                train_func()
            else:
                train_func(config)
            self.backend.on_shutdown()
        except BaseException as exc:  # noqa: BLE001 - every failure goes to the driver
            self.session.finish(exc)
        else:
            self.session.finish()

    def mark_preempted(self, info: Any) -> None:
        """The driver saw a node of this run draining: ``get_preemption_info()`` returns ``info`` from now on."""
        if self.session is not None:
            self.session.preemption = info

    def next_messages(self) -> list[tuple]:
        """Block until this worker has something for the driver; return all of it, in order."""
        messages = [self.outbox.get()]
        while True:
            try:
                messages.append(self.outbox.get_nowait())
            except queue.Empty:
                return messages

    def flush(self, timeout: float) -> list[tuple]:
        """After another rank failed: let pending uploads finish, then return what is queued."""
        if self.session is not None:
            self.session.wait_uploads(timeout)
        messages = []
        while True:
            try:
                messages.append(self.outbox.get_nowait())
            except queue.Empty:
                return messages


def _train_at_node_priority() -> None:
    """Give this worker's threads the Ray node's CPU priority instead of Ray's worker niceness (15).

    Ray starts its worker processes niced, so a training rank loses the CPU to every other
    process on the machine (Ray's own daemons included) and, on a busy node, trains far slower
    than a torchrun rank (bench/results/overhead.md). Called in the training thread: the threads
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


def _load_train_func(payload: bytes, driver_sys_path: list[str]) -> Callable:
    """Unpickle the training function; modules it references import as they do on the driver."""
    import cloudpickle

    # On the driver's node the driver's import path exists too: use it, so a function from a
    # module next to the user's script (or a test module) imports here as it does there.
    for entry in driver_sys_path:
        if entry and entry not in sys.path and os.path.isdir(entry):
            sys.path.append(entry)
    try:
        return cloudpickle.loads(payload)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            f"{exc}: the training function refers to a module that this worker cannot import. Install it "
            "on every node (pip install -e .), or ship it with ray.init(runtime_env={'py_modules': [...]}) "
            "or {'working_dir': ...}."
        ) from exc
