"""torch's thread count from the CPUs Ray assigned the current task, and glibc's malloc settings for torch. Runs in Ray task workers.

A Ray worker that imported torch before its first task (``preload_python_modules``) keeps
torch's default thread count, one per core, whatever CPUs its tasks reserve: two
one-CPU scoring workers on two cores then run four threads and each goes far slower than
alone. A task calls :func:`use_assigned_cpus` first. It also sets trainlib's malloc
settings for torch processes (:func:`trainlib.startup.keep_step_allocations`), which spare scoring the page
faults of glibc's defaults (docs/benchmarks.md, "Steady state (kept)").
"""

from __future__ import annotations


def use_assigned_cpus() -> int:
    """Give torch as many threads as the CPUs Ray assigned this task (and keep its batches' memory); return
    torch's thread count.

    Outside a Ray task (a driver, no Ray) torch's threads and malloc are left as they are.
    """
    import ray
    import torch

    from trainlib.startup import keep_step_allocations

    if not ray.is_initialized() or ray.get_runtime_context().worker.mode != ray.WORKER_MODE:
        return torch.get_num_threads()
    keep_step_allocations()
    cpus = max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
    if torch.get_num_threads() != cpus:
        torch.set_num_threads(cpus)
    return cpus
