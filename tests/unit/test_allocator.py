"""glibc malloc settings of torch training workers (trainlib/_internal/util/allocator.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT

from trainlib._internal.util import allocator

# Allocates 24 blocks of 1 MB, frees them, allocates and touches them again: with glibc's defaults the
# freed memory goes back to the kernel (unmapped or trimmed) and every page of the second round is
# faulted in again; kept by the settings, the second round faults (almost) nothing.
PROBE = r"""
import ctypes, json, resource, sys
from trainlib._internal.util.allocator import keep_step_allocations
applied = keep_step_allocations() if sys.argv[1] == "tuned" else False
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def step():
    blocks = [libc.malloc(1 << 20) for _ in range(24)]
    for b in blocks:
        ctypes.memset(b, 1, 1 << 20)
    for b in reversed(blocks):
        libc.free(b)
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
step()
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _faults(mode: str, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=60,
                         env={**environ, "PYTHONPATH": REPO_ROOT, **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(not allocator._glibc(), reason="glibc's mallopt")
def test_a_steps_allocations_are_kept_instead_of_faulted_in_again():
    default, tuned = _faults("default"), _faults("tuned")
    assert tuned["applied"] is True
    assert default["faults"] > 24 * 256 / 2  # 24 MB of 4 KB pages, faulted in again (most of them)
    assert tuned["faults"] < default["faults"] / 10


@pytest.mark.skipif(not allocator._glibc(), reason="glibc's mallopt")
def test_a_user_who_configured_malloc_is_left_alone():
    assert _faults("tuned", MALLOC_ARENA_MAX="2")["applied"] is False
    assert _faults("tuned", GLIBC_TUNABLES="glibc.malloc.trim_threshold=1000")["applied"] is False
