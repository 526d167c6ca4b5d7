"""glibc malloc settings of torch training workers (trainlib/_internal/startup/allocator.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, TESTS_DIR
from malloc_probe import PAGES

from trainlib._internal.startup import allocator

# In a fresh process: trainlib's settings applied or not, then malloc_probe's step pattern.
PROBE = r"""
import json, sys
from malloc_probe import refaulted_pages
from trainlib._internal.startup.allocator import keep_step_allocations, step_allocations_kept
applied = keep_step_allocations() if sys.argv[1] == "tuned" else False
print(json.dumps({"applied": applied, "kept": step_allocations_kept(), "faults": refaulted_pages()}))
"""


def _faults(mode: str, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, TESTS_DIR]), **env},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(not allocator._glibc(), reason="glibc's mallopt")
def test_a_steps_allocations_are_kept_instead_of_faulted_in_again():
    default, tuned = _faults("default"), _faults("tuned")
    assert tuned["applied"] is True and tuned["kept"] is True and default["kept"] is False
    assert default["faults"] > PAGES / 2  # most of the 24 MB of 4 KB pages, faulted in again
    assert tuned["faults"] < default["faults"] / 10


@pytest.mark.skipif(not allocator._glibc(), reason="glibc's mallopt")
def test_a_user_who_configured_malloc_is_left_alone():
    assert _faults("tuned", MALLOC_ARENA_MAX="2")["applied"] is False
    assert _faults("tuned", MALLOC_ARENA_MAX="2")["kept"] is False
    assert _faults("tuned", GLIBC_TUNABLES="glibc.malloc.trim_threshold=1000")["applied"] is False
