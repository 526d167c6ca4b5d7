"""A worker's bulk imports without CPython's cyclic garbage collector. Worker processes only.

CPython's collector runs every 700 net allocations of container objects, and a pass over the oldest
generation each time it has grown by a quarter. An import of torch, or of a job's module that brings in
torchvision, allocates millions of such objects that all live as long as the process: the passes over them
find next to nothing. In a worker that has imported ray, torch and trainlib's worker module, the collector
a sizeable share of the CPU that importing torchvision and torch takes (docs/benchmarks.md, "Start-up and
memory (kept)").

So while a worker imports in bulk (Ray's preload in a lean local Ray, an actor's framework, the training
function's modules when it is unpickled), the collector is paused. At the end, one collection frees what
the imports left in cycles (nothing is kept that CPython would have freed), the survivors are frozen
(``gc.freeze``: later passes skip them, as CPython's docs advise for long-lived objects), and the collector
resumes. A process whose collector is already off (its owner's choice) is left as it is.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from trainlib._internal.startup.adapter import lean_startup_enabled

_paused = False  # whether pause() turned the collector off and resume() has not yet turned it back on


def pause() -> None:
    """Turn the collector off, if it is on, until :func:`resume`."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """After :func:`pause`: collect once, freeze what survived, turn the collector back on."""
    global _paused
    if not _paused:
        return
    _paused = False
    gc.collect()
    gc.freeze()
    gc.enable()


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The block runs with the collector paused (:func:`pause`, then :func:`resume`, also if it raises). A collector
    that is already off (an outer block's, a preload's or its owner's doing) is left to whoever turned it off.
    With the start-up layer switched off, the block runs as it is."""
    if not gc.isenabled() or not lean_startup_enabled():
        yield
        return
    pause()
    try:
        yield
    finally:
        resume()
