"""The Ray that ``fit()`` connects to, and the lean local instance it starts when none is given. Driver only.

With no Ray initialised and no ``RAY_ADDRESS``, trainlib starts an embedded
single-node Ray for the run (``ray.init(address="local")``). Two of the daemons
Ray starts for it do nothing for such a run: the dashboard head (with
``include_dashboard=False`` it only hosts usage statistics) and the autoscaler
monitor (a local node never scales). They cost ~230 MB of memory and, at exit,
Ray gives each up to a second to stop, one after another. Neither is started
(``lean_start.without_unused_daemons``): ``ray.init`` waits until the dashboard head has
imported its web stack and published its address: most of ``ray.init``'s time on a small machine
(docs/benchmarks.md, "Start-up and memory (kept)").
Nor does the driver import the dashboard's dependencies only to learn that they
are installed. The log monitor, a process that
tails the workers' log files for the drivers, is not started either: a thread of
this driver reads them (``worker_logs.py``), and at exit prints their last lines
before Ray shuts down, where Ray's own exit hook sleeps 0.5 s for them to arrive. Ray's
serialization imports pyarrow, pydantic and starlette in every process unless
it is told to wait for them (``lazy_serializers.py``): the driver and every worker of the embedded Ray
are. Nor does the raylet wait for its agents to pick their ports before it registers the node and
starts its workers: it is given ports reserved here (``agent_ports.py``). Without a dashboard head, the
dashboard agent would only export Ray's metrics, which nothing reads: it is not started either
(``dashboard_agent.py``). The runtime-env agent starts only when a task or actor first asks for a
runtime env (``runtime_env_agent.py``). ``lean_start.lean_local_start`` is all of this, for
``fit()``'s embedded Ray and the pipeline's local one. The workers of both import their preload
(``worker_preload.py``) without CPython's cyclic collector (``bulk_imports.py``).

A Ray that the user initialised, or a cluster (``RAY_ADDRESS``), is never touched. With the start-up layer
switched off (``TRAINLIB_LEAN_STARTUP=0``, ``adapter.py``) the embedded Ray is a stock
``ray.init(address="local", include_dashboard=False)``.
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections.abc import Sequence
from typing import Any

from trainlib._internal import tunables
from trainlib._internal.startup.adapter import lean_startup_enabled
from trainlib._internal.startup.lazy_serializers import defer_serialization_addons
from trainlib._internal.startup.lean_start import LeanLocalRay, LeanStart, lean_local_start, lean_system_config
from trainlib._internal.startup.ray_connect import probe_ray_address
from trainlib._internal.startup.worker_logs import print_whole_lines
from trainlib._internal.startup.worker_preload import WORKER_PRELOAD_MODULES

logger = logging.getLogger("trainlib")

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
    _local_ray = lean.started() if lean is not None else None


def start_ahead_of_fit(preload: Sequence[str] = WORKER_PRELOAD_MODULES) -> bool:
    """Start the embedded Ray now, for a ``fit()`` to come (``python -m trainlib``), so that its workers import
    ``preload`` while this process still imports the job's own modules. Return False, starting nothing, where
    ``fit()`` would not start one either: Ray is up already or ``RAY_ADDRESS`` names a cluster."""
    import ray

    global _started_ahead
    if ray.is_initialized() or os.environ.get("RAY_ADDRESS") or not lean_startup_enabled():
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


def init_lean_local_ray(preload: Sequence[str], **init_kwargs: Any) -> LeanStart | None:
    """``ray.init`` of a new local Ray started lean (``lean_start.lean_local_start``), whose workers import
    ``worker_setup`` and then ``preload`` as they start (``worker_preload.preload_python_modules``). Call
    ``started()`` on the result. With the start-up layer switched off: a stock ``ray.init``, and None."""
    import ray

    # address="local": without it Ray joins the last cluster started on this machine
    # (/tmp/ray/ray_current_cluster), which may be someone else's.
    if not lean_startup_enabled():
        ray.init(address="local", include_dashboard=False, log_to_driver=True, **init_kwargs)
        return None
    with lean_local_start() as lean:
        ray.init(
            address="local",
            include_dashboard=False,
            log_to_driver=True,
            _system_config=lean_system_config(preload),
            **init_kwargs,
        )
    return lean


def started_embedded_ray() -> bool:
    """Whether the Ray this process is connected to was started by trainlib (and is still up)."""
    import ray

    return _started_here and ray.is_initialized()


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
