"""A local Ray node started lean: what is replaced while ``ray.init`` starts it, and what is kept after. Driver only.

Inside :func:`lean_local_start`, a node is started without the daemons a local run never uses
(:func:`without_unused_daemons`), without the log monitor process (``worker_logs.py``), with its agents' ports
given to the raylet (``agent_ports.py``), a stand-in for the dashboard agent (``dashboard_agent.py``) and the
runtime-env agent started on demand (``runtime_env_agent.py``); ``ray.init`` gets :func:`lean_system_config`.
Every replacement of Ray's attributes goes through ``adapter.py``: with the start-up layer switched off
(``TRAINLIB_LEAN_STARTUP=0``) or an unchecked Ray, the node starts as Ray starts it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from trainlib._internal.startup.adapter import lean_startup_enabled, replaced_attribute
from trainlib._internal.startup.agent_ports import ReservedAgentPorts, agent_ports_given_to_raylet
from trainlib._internal.startup.dashboard_agent import NO_METRICS_SYSTEM_CONFIG
from trainlib._internal.startup.worker_logs import LogTail, SkippedLogMonitor, start_log_tail, without_log_monitor
from trainlib._internal.startup.worker_preload import preload_python_modules

# Ray's settings for a lean local node: no metrics (no agent exports them: dashboard_agent.py), and no task events.
# Those feed Ray's State API and ray.timeline(), through a dashboard such a node does not run; every process of it
# would record and send them each second, and the driver's shutdown waits to flush its own (docs/benchmarks.md,
# "Start-up and memory (kept)"). Whoever wants either starts Ray before fit(), which trainlib
# never changes.
LEAN_SYSTEM_CONFIG = {**NO_METRICS_SYSTEM_CONFIG, "task_events_report_interval_ms": 0}

# Daemons of a local head node that an embedded trainlib run never uses (Ray's process-type names):
# stopped once Ray is up, if a Ray whose start without_unused_daemons() could not change started them.
UNUSED_DAEMONS = ("dashboard", "monitor")


def lean_system_config(preload: Sequence[str] = (), *, lazy_serializers: bool = True, **extra: Any) -> dict[str, Any]:
    """``ray.init``'s ``_system_config`` for a lean local node whose workers import ``preload`` as they start
    (:func:`~trainlib._internal.startup.worker_preload.preload_python_modules`), with ``extra`` settings; ``{}``
    (Ray's defaults) with the start-up layer switched off."""
    if not lean_startup_enabled():
        return {}
    wanted = bool(preload) or lazy_serializers
    modules = preload_python_modules(preload, lazy_serializers=lazy_serializers) if wanted else []
    return {**LEAN_SYSTEM_CONFIG, **extra, **({"preload_python_modules": modules} if modules else {})}


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
        if lean_startup_enabled():
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


def _local_node():
    """Ray's handle on the processes ``ray.init`` started here, or None (private API; checked)."""
    try:
        from ray._private import worker as ray_worker

        node = getattr(ray_worker, "_global_node", None)
        return node if node is not None and isinstance(getattr(node, "all_processes", None), dict) else None
    except ImportError:  # another Ray version: keep its daemons
        return None
