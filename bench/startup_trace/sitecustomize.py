"""Start-up tracer for bench/trace_startup.py: put this folder first on PYTHONPATH and set TRAINLIB_TRACE_DIR.

Python imports ``sitecustomize`` as it starts, in every process of the job (the driver and each Ray worker,
which inherit the environment). Each process appends ``<time.time()> <event>`` lines to
``$TRAINLIB_TRACE_DIR/<pid>.log``: its start, when the watched modules begin and end importing, and calls of
the watched functions. Nothing happens without TRAINLIB_TRACE_DIR. A benchmark tool only: it wraps loaders and
functions of the traced process.
"""

from __future__ import annotations

import functools
import importlib.abc
import os
import sys
import time

TRACE_DIR = os.environ.get("TRAINLIB_TRACE_DIR")
# What bench/trace_startup.py reads: these imports, and calls of these functions (module -> (object in it, or
# "" for the module itself; function)).
WATCHED_IMPORTS = {"torch", "torchvision", "ray"}
WATCHED_CALLS = {
    "ray": ("", "init"),
    "trainlib._internal.execution.worker": ("TrainWorker", "__init__"),
}
_log = None


def event(text: str) -> None:
    global _log
    if _log is None:
        _log = open(os.path.join(TRACE_DIR, f"{os.getpid()}.log"), "a", buffering=1)
    _log.write(f"{time.time():.4f} {text}\n")


def _timed(owner: object, name: str, label: str) -> None:
    original = getattr(owner, name, None)
    if original is None:
        return

    @functools.wraps(original)
    def timed(*args, **kwargs):
        event(f"call {label}")
        try:
            return original(*args, **kwargs)
        finally:
            event(f"return {label}")

    setattr(owner, name, timed)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the ``exec_module`` of the watched modules' own loaders."""

    def find_spec(self, name, path=None, target=None):
        if name not in WATCHED_IMPORTS and name not in WATCHED_CALLS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is None:
                continue
            exec_module = getattr(spec.loader, "exec_module", None)
            if exec_module is not None:
                def traced(module, exec_module=exec_module):
                    if name in WATCHED_IMPORTS:
                        event(f"import {name}")
                    exec_module(module)
                    if name in WATCHED_IMPORTS:
                        event(f"imported {name}")
                    if name in WATCHED_CALLS:
                        owner_name, function = WATCHED_CALLS[name]
                        _timed(getattr(module, owner_name) if owner_name else module, function,
                               f"{owner_name or name}.{function}")
                try:  # on the loader instance, so that its type (and package resources) stay the same
                    spec.loader.exec_module = traced
                except AttributeError:
                    pass
            return spec
        return None


if TRACE_DIR:
    event("process")
    sys.meta_path.insert(0, _Finder())
