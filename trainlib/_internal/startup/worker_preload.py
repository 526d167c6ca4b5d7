"""What the worker processes of a lean local Ray import as they start (Ray's ``preload_python_modules``), before
they accept work. Driver only: names, not imports.

The raylet starts one worker per CPU as soon as the driver connects, so torch (~1-3 s of CPU a process) loads
while the driver prepares storage and the placement group, not after the actors are created on those workers.
Every worker Ray starts later imports them too, so a trainer preloads only what its backend uses: 32 workers of a
torch-free trainer each importing torch cost ~1 min of CPU (bench_scaling.py).
"""

from __future__ import annotations

from collections.abc import Sequence

WORKER_MODULE = "trainlib._internal.execution.worker"
# Imported second (after PRELOAD_BEGIN_MODULE) by every worker of the embedded Ray: Ray's serializers for pyarrow,
# pydantic and starlette wait for those libraries instead of importing them (~50 MB a process; lazy_serializers.py).
WORKER_SETUP_MODULE = "trainlib._internal.startup.worker_setup"
# Imported first and last, around all the others: the preload runs without the cyclic collector (bulk_imports.py).
PRELOAD_BEGIN_MODULE = "trainlib._internal.startup.preload_begin"
PRELOAD_END_MODULE = "trainlib._internal.startup.preload_end"
TORCH_MODULES = ("torch", "torch.distributed")
WORKER_PRELOAD_MODULES = (*TORCH_MODULES, WORKER_MODULE)  # a Ray that runs TorchTrainer's workers


def preload_python_modules(preload: Sequence[str], *, lazy_serializers: bool = True) -> list[str]:
    """Ray's ``preload_python_modules`` for a lean local Ray's workers: ``preload`` with the cyclic collector paused
    around it, after :data:`WORKER_SETUP_MODULE` (Ray's serializers wait for their libraries) if
    ``lazy_serializers``."""
    setup = [WORKER_SETUP_MODULE] if lazy_serializers else []
    return [PRELOAD_BEGIN_MODULE, *setup, *preload, PRELOAD_END_MODULE]
