"""Ray's serializers for pyarrow, pydantic and starlette, registered when each is first imported
instead of by importing it.

Ray creates a serialization context in every process at its first ``ray.put``, ``ray.get`` or task,
and that context (``ray.util.serialization_addons.apply``) imports three libraries to register
serializers for their objects, whether or not the process ever holds one:

- pyarrow, for Arrow tables and arrays: ~41 MB and ~0.1 s a process;
- pydantic with its v1 compatibility layer, for v1 ``ModelField``\\s: ~8 MB and ~0.12 s;
- starlette, for its ``State``: ~1 MB and ~0.01 s.

A trainlib run's driver and ranks use none of them. With :func:`defer_serialization_addons`, a context
created while one of them is not imported gets Ray's serializers for it the moment something imports
it, so before any such object can exist in the process (Ray Data, FastAPI and Prefect users see no
difference: their processes import the library, and Ray's serializers are registered then).

It replaces ``apply``, a developer API of Ray's, only where that function calls exactly the three
registrations known here (checked: with any other Ray, nothing changes). trainlib applies it only to
the embedded Ray that ``fit()`` starts (``embedded_ray.ensure_ray``): the driver and, through Ray's worker
preload (``worker_setup``), every worker process of that Ray. The pipeline's local Ray does without it: there
the task workers import all three anyway (Prefect, mlflow), and a pipeline whose workers preloaded
``worker_setup`` was slower (docs/benchmarks.md, "Tried, not kept").
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable
from typing import Any

from trainlib._internal.startup.adapter import install_attribute

# What Ray 2.60's serialization_addons.apply calls; any other apply is left alone.
KNOWN_APPLY_NAMES = frozenset(
    {
        "ray._common.pydantic_compat",
        "register_pydantic_serializers",
        "register_starlette_serializer",
        "sys",
        "platform",
        "ray._private.arrow_serialization",
        "_register_custom_datasets_serializers",
    }
)

Registration = Callable[[Any], None]  # registers one library's serializers in a serialization context

_lock = threading.Lock()
_waiting: dict[str, list[Any]] = {}  # module -> serialization contexts created before it was imported
_installed = False


def _register_pydantic(context: Any) -> None:
    from ray._common.pydantic_compat import register_pydantic_serializers

    register_pydantic_serializers(context)


def _register_starlette(context: Any) -> None:
    from ray.util.serialization_addons import register_starlette_serializer

    register_starlette_serializer(context)


def _register_arrow(context: Any) -> None:
    from ray._private.arrow_serialization import _register_custom_datasets_serializers

    _register_custom_datasets_serializers(context)


def _registrations() -> dict[str, Registration]:
    """The module whose import makes each of Ray's registrations due, as Ray's ``apply`` makes them."""
    # Ray's pydantic serializers are for v1's ModelField, which exists once pydantic.v1.fields has run. Not
    # "pydantic": Ray's own pydantic_compat is often the first to import it, and the registration, which
    # imports pydantic_compat, then met that half-imported module; its ImportError reached pydantic_compat's
    # `try: import pydantic`, which concluded that pydantic is not installed (Ray Data's actors then failed).
    due = {"pydantic.v1.fields": _register_pydantic, "starlette.datastructures": _register_starlette}
    if sys.platform != "win32":  # as in Ray: no Arrow serializers on Windows
        due["pyarrow"] = _register_arrow
    return due


def defer_serialization_addons() -> bool:
    """Make Ray register each of its library serializers once that library is imported; False if this Ray cannot."""
    global _installed
    try:
        from ray.util import serialization_addons
    except ImportError:
        return False
    with _lock:
        if _installed:
            return True
        if not set(serialization_addons.apply.__code__.co_names) <= KNOWN_APPLY_NAMES:
            return False
        registrations = _registrations()

        def apply_once_imported(context: Any) -> None:
            due = []
            with _lock:
                for module, register in registrations.items():
                    if module in sys.modules:
                        due.append(register)
                    else:
                        _waiting.setdefault(module, []).append(context)
            for register in due:
                register(context)

        if not install_attribute(serialization_addons, "apply", lambda original: apply_once_imported):
            return False  # the start-up layer is off, or this Ray is not the one checked
        pending = {module: register for module, register in registrations.items() if module not in sys.modules}
        if pending:  # else every context registers at once, as in Ray
            sys.meta_path.insert(0, _AfterImport(pending))
        _installed = True
        return True


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds each module as the finders after it would, and registers the contexts waiting for it once it has run.

    A lookup need not be an import (``importlib.util.find_spec`` only looks, as trainlib's lean start does
    for the dashboard's dependencies, pydantic among them): every spec found is made to register when it
    runs, until one has run.
    """

    def __init__(self, registrations: dict[str, Registration]):
        self.registrations = dict(registrations)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.registrations:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module: Any) -> None:
            exec_module(module)  # if it raises, the module is not imported and the next import registers
            register = self.registrations.pop(fullname, None)
            if register is None:  # registered when an earlier spec of it ran
                return
            parent, _, child = fullname.rpartition(".")
            if parent:  # what the import system does next, done first: the registration reaches it as parent.child
                setattr(sys.modules[parent], child, module)
            with _lock:
                waiting = _waiting.pop(fullname, [])
            for context in waiting:
                register(context)

        spec.loader.exec_module = exec_then_register
        return spec
