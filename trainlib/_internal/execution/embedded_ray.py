"""The Ray that ``fit()`` connects to, and the lean local instance it starts when none is given. Driver only.

With no Ray initialised and no ``RAY_ADDRESS``, trainlib starts an embedded
single-node Ray for the run (``ray.init(address="local")``). Two of the daemons
Ray starts for it do nothing for such a run: the dashboard head (with
``include_dashboard=False`` it only hosts usage statistics) and the autoscaler
monitor (a local node never scales). They cost ~230 MB of memory and, at exit,
Ray gives each up to a second to stop, one after another. Neither is started
(:func:`without_unused_daemons`): ``ray.init`` waits until the dashboard head has
imported its web stack and published its address: most of ``ray.init``'s time on a small machine
(docs/benchmarks.md, "Start-up and memory (kept)").
Nor does the driver import the dashboard's dependencies only to learn that they
are installed. The log monitor, a process that
tails the workers' log files for the drivers, is not started either: a thread of
this driver reads them (``worker_logs.py``), and at exit prints their last lines
before Ray shuts down, where Ray's own exit hook sleeps 0.5 s for them to arrive. Ray's
serialization imports pyarrow, pydantic and starlette in every process (~50 MB and ~0.2 s each) unless
it is told to wait for them (``lazy_serializers.py``): the driver and every worker of the embedded Ray
are. Nor does the raylet wait for its agents to pick their ports before it registers the node and
starts its workers: it is given ports reserved here (``agent_ports.py``). Without a dashboard head, the
dashboard agent would only export Ray's metrics, which nothing reads: it is not started either
(``dashboard_agent.py``). The runtime-env agent starts only when a task or actor first asks for a
runtime env (``runtime_env_agent.py``). :func:`lean_local_start` is all of this, for
``fit()``'s embedded Ray and the pipeline's local one. The workers of both import their preload
(``worker_preload.py``) without CPython's cyclic collector (``bulk_imports.py``): ~0.4 s less to the first step.

A Ray that the user initialised, or a cluster (``RAY_ADDRESS``), is never touched.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from trainlib._internal import tunables
from trainlib._internal.execution.agent_ports import ReservedAgentPorts, agent_ports_given_to_raylet
from trainlib._internal.execution.dashboard_agent import NO_METRICS_SYSTEM_CONFIG
from trainlib._internal.execution.lazy_serializers import defer_serialization_addons
from trainlib._internal.execution.ray_connect import probe_ray_address
from trainlib._internal.execution.worker_logs import (
    LogTail,
    SkippedLogMonitor,
    print_whole_lines,
    start_log_tail,
    without_log_monitor,
)
from trainlib._internal.execution.worker_preload import WORKER_PRELOAD_MODULES, preload_python_modules
from trainlib._internal.util.patching import replaced_attribute

logger = logging.getLogger("trainlib")

# Ray's settings for a lean local node: no metrics (no agent exports them: dashboard_agent.py), and no task events.
# Those feed Ray's State API and ray.timeline(), through a dashboard such a node does not run; every process of it
# would record and send them each second, and the driver's shutdown waits to flush its own (docs/benchmarks.md,
# "Start-up and memory (kept)"). Whoever wants either starts Ray before fit(), which trainlib
# never changes.
LEAN_SYSTEM_CONFIG = {**NO_METRICS_SYSTEM_CONFIG, "task_events_report_interval_ms": 0}

# Daemons of a local head node that an embedded trainlib run never uses (Ray's process-type names):
# stopped once Ray is up, if a Ray whose start without_unused_daemons() could not change started them.
UNUSED_DAEMONS = ("dashboard", "monitor")

_started_here = False
_started_ahead = False  # started by start_ahead_of_fit() and not used by a fit() yet
_last_fit_end = 0.0
_local_ray: LeanLocalRay | None = None  # what the embedded Ray keeps in this process, until it is shut down


def ensure_ray(preload: Sequence[str] = WORKER_PRELOAD_MODULES) -> None:
    """Connect to Ray: the cluster in RAY_ADDRESS if set (probed first), else start a lean embedded local one.

    ``preload``: the modules the embedded Ray's workers import as they start (its first caller's choice).
    """
    import ray

    global _started_here, _started_ahead, _local_ray
    _started_ahead = False  # a fit() takes the Ray started ahead for it
    print_whole_lines()  # also for a Ray the user started: its printer prints the workers' lines
    if ray.is_initialized():
        return
    if _local_ray is not None:  # the reader and ports of an embedded Ray that the user shut down
        _local_ray.stop()
        _local_ray = None
    address = os.environ.get("RAY_ADDRESS")
    if address:
        probe_ray_address(address)  # seconds, not minutes of GCS retries, when nothing listens there
        ray.init(log_to_driver=True)
        return
    defer_serialization_addons()  # this driver's serialization context: none of the three unless the user imports it
    lean = init_lean_local_ray(preload)
    _started_here = True
    # Registered after Ray's own exit hook, so it runs first (atexit is last in, first out).
    atexit.register(shutdown_embedded_ray)
    _local_ray = lean.started()


def start_ahead_of_fit(preload: Sequence[str] = WORKER_PRELOAD_MODULES) -> bool:
    """Start the embedded Ray now, for a ``fit()`` to come (``python -m trainlib``), so that its workers import
    ``preload`` while this process still imports the job's own modules. Return False, starting nothing, where
    ``fit()`` would not start one either: Ray is up already or ``RAY_ADDRESS`` names a cluster."""
    import ray

    global _started_ahead
    if ray.is_initialized() or os.environ.get("RAY_ADDRESS"):
        return False
    ensure_ray(preload)
    _started_ahead = True
    return True


def give_way_to_user_ray() -> bool:
    """Before a ``ray.init`` of the user's own: shut down the Ray started ahead of ``fit()``, if no ``fit()`` has used
    it, and return True; the user's call then starts (or joins) the Ray it asks for, as without the early start."""
    global _started_here, _started_ahead
    if not (_started_ahead and started_embedded_ray()):
        return False
    shutdown_embedded_ray()  # as at exit: the workers' last lines printed, the agents' ports given back, Ray down
    _started_here = _started_ahead = False
    return True


def init_lean_local_ray(preload: Sequence[str], **init_kwargs: Any) -> LeanStart:
    """``ray.init`` of a new local Ray started lean (:func:`lean_local_start`), whose workers import
    ``worker_setup`` and then ``preload`` as they start (:func:`preload_python_modules`). Call
    ``started()`` on the result."""
    import ray

    # address="local": without it Ray joins the last cluster started on this machine
    # (/tmp/ray/ray_current_cluster), which may be someone else's.
    with lean_local_start() as lean:
        ray.init(
            address="local",
            include_dashboard=False,
            log_to_driver=True,
            _system_config={**LEAN_SYSTEM_CONFIG, "preload_python_modules": preload_python_modules(preload)},
            **init_kwargs,
        )
    return lean


def started_embedded_ray() -> bool:
    """Whether the Ray this process is connected to was started by trainlib (and is still up)."""
    import ray

    return _started_here and ray.is_initialized()


@dataclasses.dataclass
class LeanLocalRay:
    """What a lean local Ray keeps in the process that started it, until Ray is shut down."""

    log_tail: LogTail | None  # the workers' output, read here instead of by Ray's log monitor
    agent_ports: ReservedAgentPorts

    def stop(self) -> None:
        """Before (or after) Ray's shutdown: print the workers' last lines, give the agents' ports back."""
        try:
            if self.log_tail is not None:
                self.log_tail.stop()
        finally:
            self.agent_ports.release()


@dataclasses.dataclass
class LeanStart:
    """Yielded by :func:`lean_local_start`; once Ray is up, :meth:`started` finishes the lean start."""

    log_monitor: SkippedLogMonitor
    agent_ports: ReservedAgentPorts

    def started(self) -> LeanLocalRay:
        """The node started in the block is up and this process is connected to it."""
        stop_unused_daemons()
        return LeanLocalRay(log_tail=start_log_tail(self.log_monitor), agent_ports=self.agent_ports)

    def joined(self) -> None:
        """No node was started in the block (``ray.init`` joined a running Ray): nothing to keep."""
        self.agent_ports.release()


@contextlib.contextmanager
def lean_local_start() -> Iterator[LeanStart]:
    """Inside the block, a local Ray node is started lean: no unused daemons (:func:`without_unused_daemons`),
    no log monitor process (``worker_logs.py``), a raylet that does not wait for its agents' ports
    (``agent_ports.py``), runs no dashboard agent (``dashboard_agent.py``; pass
    :data:`LEAN_SYSTEM_CONFIG` to ``ray.init``) and starts the runtime-env agent on demand
    (``runtime_env_agent.py``). After the block, call :meth:`LeanStart.started` (or ``joined``)."""
    with without_unused_daemons(), without_log_monitor() as log_monitor, agent_ports_given_to_raylet() as agent_ports:
        try:
            yield LeanStart(log_monitor=log_monitor, agent_ports=agent_ports)
        except BaseException:
            agent_ports.release()  # the node did not come up (or half): nothing listens on them for us
            raise


@contextlib.contextmanager
def without_unused_daemons() -> Iterator[None]:
    """Inside the block, a local Ray node started with ``include_dashboard=False`` is started lean.

    - No dashboard head: Ray starts it anyway, for usage statistics only, and ``ray.init`` polls
      until it is up (most of ``ray.init``'s time: docs/benchmarks.md, "Start-up and memory (kept)").
    - No autoscaler monitor: a local node never scales. It was stopped once Ray was up; not
      starting it also spares its start (a Python process importing Ray) on the critical path.
    - Ray learns whether the dashboard's dependencies are installed (to start its agent in full
      or "minimal" mode) without importing them in this process (~0.26 s and ~24 MB).

    Ray's private ``Node.start_api_server``, ``Node.start_monitor`` and
    ``get_dashboard_dependency_error`` are replaced for the block; with a Ray that lacks one, that
    step is Ray's own. With ``include_dashboard`` true or unset, Ray starts its dashboard as usual.
    Not thread-safe against another thread starting a Ray node in the same process (nothing in
    trainlib does).
    """
    try:
        from ray._private import utils as ray_utils
        from ray._private.node import Node
    except ImportError:
        yield
        return
    with (
        replaced_attribute(Node, "start_api_server", _without_dashboard_head),
        replaced_attribute(Node, "start_monitor", lambda original: _no_monitor),
        replaced_attribute(ray_utils, "get_dashboard_dependency_error", lambda original: dashboard_dependency_error),
    ):
        yield


def _without_dashboard_head(original: Callable[..., None]) -> Callable[..., None]:
    def start_api_server(self: Any, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
        if include_dashboard is not False:
            original(self, include_dashboard=include_dashboard, raise_on_failure=raise_on_failure)
            return
        self._webui_url = None  # what a head node has before its dashboard starts: "no dashboard"

    return start_api_server


def _no_monitor(self: Any) -> None:
    """A local node's autoscaler monitor: not started."""


def dashboard_dependency_error() -> ImportError | None:
    """Ray's ``get_dashboard_dependency_error`` without the imports: whether every module that
    ``ray.dashboard.optional_deps`` imports is installed (found on the path, packages and submodules
    alike, e.g. ``opentelemetry.exporter.prometheus`` in its namespace package; not imported)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("ray.dashboard.optional_deps")
    if spec is None or not spec.origin:
        return ImportError("No module named 'ray.dashboard.optional_deps'")
    with open(spec.origin) as f:
        tree = ast.parse(f.read())
    names = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module and not node.level]
    for name in dict.fromkeys(names):
        if not _module_found(name):
            return ImportError(f"No module named {name!r}", name=name)
    return None


def _module_found(name: str) -> bool:
    """Whether the module ``name`` (dotted or not) is on the path, found without importing it or its parents."""
    import importlib.machinery
    import importlib.util

    top, *rest = name.split(".")
    spec = importlib.util.find_spec(top)
    for part in rest:
        locations = spec.submodule_search_locations if spec is not None else None
        if not locations:
            return False
        spec = importlib.machinery.PathFinder.find_spec(part, list(locations))
    return spec is not None


def stop_unused_daemons() -> list[str]:
    """Stop the daemons of the embedded node that a trainlib run never uses; return their names."""
    node = _local_node()
    if node is None:
        return []
    stopped = []
    for process_type in UNUSED_DAEMONS:
        for info in node.all_processes.get(process_type, []):
            if info.process.poll() is None:
                info.process.kill()  # stateless: nothing to flush; Ray's shutdown reaps it
                stopped.append(process_type)
    return stopped


def note_fit_ended() -> None:
    """Called when ``fit()`` returns: the exit hook lets the workers' last log lines arrive after it."""
    global _last_fit_end
    _last_fit_end = time.monotonic()


def shutdown_embedded_ray() -> None:
    """At exit: shut down the Ray trainlib started, without Ray's fixed half-second sleep."""
    global _local_ray
    if _local_ray is not None:  # also after the user shut Ray down: the workers' last lines are in its files
        _local_ray.stop()  # reads and prints them now: nothing to wait for
        _local_ray = None
    elif started_embedded_ray():  # Ray's log monitor delivers them: give it what is left of Ray's half second
        left = tunables.WORKER_LOG_FLUSH_S - (time.monotonic() - _last_fit_end)
        if _last_fit_end and left > 0:
            time.sleep(left)
    if not started_embedded_ray():
        return
    import ray

    try:
        ray.shutdown()
    except Exception as exc:  # noqa: BLE001 - exiting anyway; Ray's own hook and reaper clean up
        logger.debug("Fast Ray shutdown failed (%s); Ray's exit hook takes over", exc)


def _local_node():
    """Ray's handle on the processes ``ray.init`` started here, or None (private API; checked)."""
    try:
        from ray._private import worker as ray_worker

        node = getattr(ray_worker, "_global_node", None)
        return node if node is not None and isinstance(getattr(node, "all_processes", None), dict) else None
    except ImportError:  # another Ray version: keep its daemons
        return None
