"""trainlib's start-up layer, for drivers other than ``fit()`` (the pipeline's task runner). Public, not Ray Train's API.

``fit()`` starts an embedded local Ray lean (no dashboard, autoscaler monitor, log monitor or
dashboard agent; the runtime-env agent on demand; the workers preloading torch). A driver that
starts its own local Ray (prefect-ray's task runner) gets the same start through this module:

    with lean_local_start() as lean:
        ray.init(address="local", include_dashboard=False, _system_config=lean_system_config(modules))
    local_ray = lean.started()  # or lean.joined() if ray.init joined a running Ray
    ...
    local_ray.stop()  # the workers' last lines printed, the agents' ports given back; then ray.shutdown()

Also here: :func:`probe_ray_address` (an address that does not answer fails in seconds),
:func:`print_whole_lines` (the workers' output printed a line at a time), and, for a Ray worker
process that trains or scores with torch, :func:`keep_step_allocations` (glibc malloc settings).

The start-up layer replaces private attributes of Ray (and Prefect and MLflow, for the pipeline) through one
adapter that names the versions it was checked on (:data:`CHECKED_VERSIONS`); :func:`replaced_attribute` and
:func:`install_attribute` are that adapter's entries for code outside trainlib. ``TRAINLIB_LEAN_STARTUP=0``
(:data:`LEAN_STARTUP_ENV_VAR`) switches the whole layer off: stock ``ray.init``, nothing replaced. docs/startup.md.
"""

from trainlib._internal.startup.adapter import (
    CHECKED_VERSIONS,
    LEAN_STARTUP_ENV_VAR,
    install_attribute,
    lean_startup_enabled,
    replaced_attribute,
)
from trainlib._internal.startup.allocator import keep_step_allocations
from trainlib._internal.startup.lean_start import LeanLocalRay, LeanStart, lean_local_start, lean_system_config
from trainlib._internal.startup.ray_connect import RayUnreachableError, probe_ray_address
from trainlib._internal.startup.worker_logs import print_whole_lines
from trainlib._internal.startup.worker_preload import WORKER_PRELOAD_MODULES

__all__ = [
    "CHECKED_VERSIONS",
    "LEAN_STARTUP_ENV_VAR",
    "WORKER_PRELOAD_MODULES",
    "LeanLocalRay",
    "LeanStart",
    "RayUnreachableError",
    "install_attribute",
    "keep_step_allocations",
    "lean_local_start",
    "lean_startup_enabled",
    "lean_system_config",
    "print_whole_lines",
    "probe_ray_address",
    "replaced_attribute",
]
