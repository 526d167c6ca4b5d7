"""Ray's Arrow serializers, registered when pyarrow is first imported instead of by importing it.

Ray creates a serialization context in every process at its first ``ray.put``, ``ray.get`` or task,
and that context imports pyarrow to register serializers for Arrow objects, whether or not the
process ever holds one: ~41 MB of memory and ~0.1 s in the driver and in each worker of a trainlib
run, about the whole of the gap between a two-worker job's peak memory and 1.2x torchrun's
(docs/benchmarks.md). With :func:`defer_arrow_serializers`, a context created while pyarrow is not
imported gets Ray's serializers the moment something imports pyarrow, so before any Arrow object
can exist in the process (Ray Data, pandas and Arrow users see no difference).

It replaces a private function of Ray's (checked: with a Ray without it nothing changes), so
trainlib applies it only to the embedded Ray it starts itself: the driver and, through Ray's worker
preload (``worker_setup``), every worker process of that Ray.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from typing import Any, Callable

_lock = threading.Lock()
_waiting: list[Any] = []  # serialization contexts created before pyarrow was imported
_installed = False


def defer_arrow_serializers() -> bool:
    """Make Ray register its Arrow serializers once pyarrow is imported; False if this Ray cannot."""
    global _installed
    try:
        from ray._private import arrow_serialization
    except ImportError:
        return False
    with _lock:
        if _installed:
            return True
        register = getattr(arrow_serialization, "_register_custom_datasets_serializers", None)
        if register is None:
            return False

        def register_once_imported(context: Any) -> None:
            with _lock:
                if "pyarrow" not in sys.modules:
                    _waiting.append(context)
                    return
            register(context)

        arrow_serialization._register_custom_datasets_serializers = register_once_imported
        if "pyarrow" not in sys.modules:  # else every context registers at once, as in Ray
            sys.meta_path.insert(0, _AfterPyarrowImport(register))
        _installed = True
        return True


class _AfterPyarrowImport(importlib.abc.MetaPathFinder):
    """Finds pyarrow as the finders after it would, and registers the waiting contexts once it has run."""

    def __init__(self, register: Callable[[Any], None]):
        self.register = register
        self.done = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "pyarrow" or self.done:
            return None
        self.done = True  # pyarrow is imported once per process; every later lookup passes through
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
            exec_module(module)
            with _lock:
                waiting = list(_waiting)
                _waiting.clear()
            for context in waiting:
                self.register(context)

        spec.loader.exec_module = exec_then_register
        return spec
