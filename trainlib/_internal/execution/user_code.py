"""The user's training function on nodes that lack its module. Runs on the driver; ``missing_modules`` in workers.

cloudpickle pickles a function by reference (``module.name``) unless it lives in
``__main__``; a worker on a node that cannot import that module then fails. The
driver finds the user's own modules the function needs (its module and the
modules its globals come from, when their files lie outside the Python
installation), asks one worker per node which of them it cannot import, and
pickles those by value (``cloudpickle.register_pickle_by_value``). Installed
packages (torch, numpy, trainlib itself) stay by reference: a node needs them
installed, or shipped with ``runtime_env={"py_modules": [...]}``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Iterable
from typing import Any

from ray import cloudpickle  # the pickler of train_fn.py: by-value registrations must go to its registry

_REGISTRY_LOCK = threading.Lock()  # cloudpickle's by-value registry is process-global


@functools.lru_cache(maxsize=1)
def _installed_roots() -> tuple[str, ...]:
    """Folders of the Python installation: stdlib and site-packages (of this venv and its base)."""
    roots = set()
    for scheme_path in ("stdlib", "platstdlib", "purelib", "platlib"):
        for vars_ in ({}, {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}):
            path = sysconfig.get_paths(vars=vars_).get(scheme_path)
            if path:
                roots.add(os.path.realpath(path))
    roots.update(os.path.realpath(p) for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages")))
    return tuple(sorted(roots))


def _is_user_module(module: types.ModuleType | None) -> bool:
    """Whether ``module`` is the user's own code: a file outside the Python installation."""
    if module is None or module.__name__ == "__main__":  # __main__ is pickled by value already
        return False
    path = getattr(module, "__file__", None)
    if not path or not path.endswith(".py"):  # built-in, namespace or compiled extension module
        return False
    real = os.path.realpath(path)
    return not any(real == root or real.startswith(root + os.sep) for root in _installed_roots())


def user_modules(func: Callable) -> list[str]:
    """Top-level names of the user's modules that ``func`` needs: its own and those its globals come from."""
    target = getattr(func, "func", func)  # functools.partial
    target = getattr(target, "__wrapped__", target)
    names: list[str] = []

    def add(module_name: str | None) -> None:
        if not module_name:
            return
        top = module_name.split(".")[0]
        if top not in names and _is_user_module(sys.modules.get(module_name)):
            names.append(top)

    add(getattr(target, "__module__", None))
    code = getattr(target, "__code__", None)
    if code is not None:
        glb = getattr(target, "__globals__", {})
        for name in _global_names(code):
            value = glb.get(name)
            if isinstance(value, types.ModuleType):
                add(value.__name__)
            elif value is not None:
                add(getattr(value, "__module__", None))
    return names


def _global_names(code: types.CodeType) -> Iterable[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # nested functions and comprehensions
            yield from _global_names(const)


def missing_modules(names: list[str]) -> list[str]:
    """Of ``names``, those this process cannot import (without importing anything). Runs in a worker."""
    missing = []
    for name in names:
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
        except (ImportError, ValueError):
            missing.append(name)
    return missing


def dumps_for_workers(func: Callable, by_value: Iterable[str]) -> bytes:
    """Pickle ``func`` with the modules in ``by_value`` (top-level names) pickled by value."""
    modules = [sys.modules[name] for name in by_value if name in sys.modules]
    with _REGISTRY_LOCK:
        registered = []
        try:
            for module in modules:
                if module.__name__ not in cloudpickle.list_registry_pickle_by_value():
                    cloudpickle.register_pickle_by_value(module)
                    registered.append(module)
            return cloudpickle.dumps(func)
        finally:
            for module in registered:
                cloudpickle.unregister_pickle_by_value(module)


def describe(by_value: list[str], nodes: list[Any]) -> str:
    """A log line: which modules were shipped by value and why."""
    return (
        f"Shipping module(s) {', '.join(by_value)} with the training function: node(s) "
        f"{', '.join(str(n) for n in nodes)} cannot import them"
    )
