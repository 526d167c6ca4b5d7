"""glibc malloc settings for a training process: step-sized allocations served from the heap and kept. Workers only.

A training step allocates and frees the same tensors every step, several MB each. With glibc's
defaults such a block is mmap'd and unmapped each time until glibc's adaptive threshold has grown
past it, and the heap is trimmed whenever more than twice that threshold is free at its top; every
page given back is faulted in again, zeroed, on the next step. The settings below keep those pages,
trading some resident memory for the faults (docs/benchmarks.md, "Steady state (kept)"). torchrun's
ranks run with glibc's defaults.

The settings are glibc's ``mallopt`` options, set once per worker process before the training
thread starts (the process's DataLoader workers, forked from it, inherit them). A process whose
environment sets glibc's own malloc variables (``MALLOC_*_``, ``GLIBC_TUNABLES``) is left as its
owner configured it, as is any libc that is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

from trainlib._internal import tunables
from trainlib._internal.startup.adapter import lean_startup_enabled

logger = logging.getLogger("trainlib")

_M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX")
# Whether this process runs with the settings. glibc cannot be asked: a process whose own allocations
# already raised glibc's adaptive thresholds to their maximum behaves the same with and without them.
_kept = False


def keep_step_allocations(
    mmap_threshold: int = tunables.WORKER_MALLOC_MMAP_THRESHOLD_BYTES,
    trim_threshold: int = tunables.WORKER_MALLOC_TRIM_THRESHOLD_BYTES,
) -> bool:
    """Serve allocations up to ``mmap_threshold`` from the heap and trim it only past ``trim_threshold``
    free; return whether the settings were applied (False: not glibc, the user configured malloc, or the start-up
    layer is switched off)."""
    if not lean_startup_enabled():
        return False
    if any(name in os.environ for name in _USER_SETTINGS) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    if not _glibc():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        # mallopt returns 1 on success; setting either option also turns glibc's adaptive thresholds off.
        applied = (
            libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1
            and libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1
        )
    except (OSError, AttributeError) as exc:
        logger.debug("glibc malloc settings not applied: %s", exc)
        return False
    global _kept
    _kept = _kept or applied
    return applied


def step_allocations_kept() -> bool:
    """Whether :func:`keep_step_allocations` applied its settings in this process."""
    return _kept


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (ValueError, OSError, AttributeError):  # not a GNU system
        return False
