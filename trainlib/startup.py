"""trainlib's start-up layer, for drivers other than ``fit()`` (the pipeline's task runner). Public, not Ray Train's API.

``fit()`` starts an embedded local Ray lean (no dashboard, autoscaler monitor, log monitor or
dashboard agent; the runtime-env agent on demand; the workers preloading torch). A driver that
starts its own local Ray (prefect-ray's task runner) gets the same start through this module:

    with lean_local_start() as lean:
        ray.init(address="local", include_dashboard=False,
                 _system_config={**LEAN_SYSTEM_CONFIG, "preload_python_modules": preload_python_modules(modules)})
    local_ray = lean.started()  # or lean.joined() if ray.init joined a running Ray
    ...
    local_ray.stop()  # the workers' last lines printed, the agents' ports given back; then ray.shutdown()

Also here: :func:`probe_ray_address` (an address that does not answer fails in seconds),
:func:`print_whole_lines` (the workers' output printed a line at a time), and, for a Ray worker
process that trains or scores with torch, :func:`keep_step_allocations` (glibc malloc settings).

The start-up layer replaces private attributes of Ray (and Prefect, for the pipeline) through one
adapter that names the versions it was checked on; :func:`replaced_attribute` is that adapter's
entry for code outside trainlib. Everything here is documented in docs/startup.md.
"""

from trainlib._internal.execution.embedded_ray import LEAN_SYSTEM_CONFIG, LeanLocalRay, LeanStart, lean_local_start
from trainlib._internal.execution.ray_connect import RayUnreachableError, probe_ray_address
from trainlib._internal.execution.worker_logs import print_whole_lines
from trainlib._internal.execution.worker_preload import WORKER_PRELOAD_MODULES, preload_python_modules
from trainlib._internal.util.allocator import keep_step_allocations
from trainlib._internal.util.patching import replaced_attribute

__all__ = [
    "LEAN_SYSTEM_CONFIG",
    "WORKER_PRELOAD_MODULES",
    "LeanLocalRay",
    "LeanStart",
    "RayUnreachableError",
    "keep_step_allocations",
    "lean_local_start",
    "preload_python_modules",
    "print_whole_lines",
    "probe_ray_address",
    "replaced_attribute",
]
