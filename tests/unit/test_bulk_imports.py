"""The cyclic collector paused around a worker's bulk imports (bulk_imports.py): off inside, on after, what the block
left in cycles freed before the survivors are frozen, a collector its owner turned off left off."""

from __future__ import annotations

import gc
import weakref

import pytest

from trainlib._internal.startup import bulk_imports
from trainlib._internal.startup.bulk_imports import collector_paused


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle_with_ref() -> weakref.ref:
    """A two-object cycle that nothing else references: only the cyclic collector frees it."""
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture(autouse=True)
def _restore_collector():
    yield
    bulk_imports._paused = False
    gc.unfreeze()  # this test process's objects back to the oldest generation, as before the test
    gc.enable()


def test_block_runs_without_the_collector_then_frees_its_cycles_and_freezes_the_rest():
    gc.unfreeze()
    kept = []
    with collector_paused():
        assert not gc.isenabled()
        dead = _cycle_with_ref()
        kept.append(_Node())  # lives on: frozen
        gc.collect(0)  # a collection still runs when asked; the automatic ones do not
    assert gc.isenabled()
    assert dead() is None  # freed by the block's one collection, not frozen with the survivors
    assert gc.get_freeze_count() > 0
    # Frozen: tracked, but in none of the generations the collector scans.
    assert gc.is_tracked(kept[0]) and not any(obj is kept[0] for obj in gc.get_objects())


def test_cycles_made_during_the_block_wait_for_its_end():
    with collector_paused():
        ref = _cycle_with_ref()
        for _ in range(20_000):  # far past the 700 allocations that would trigger a pass
            [[]]  # noqa: B018 - allocations that count towards a gc pass
        assert ref() is not None
    assert ref() is None


def test_collector_its_owner_turned_off_stays_off_and_nothing_is_frozen():
    gc.unfreeze()
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_collector_resumes_when_the_block_raises():
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("boom")
    assert gc.isenabled()


def test_inner_block_leaves_the_resume_to_the_outer_one():
    with collector_paused():
        with collector_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_preload_pause_then_resume_and_a_resume_without_pause_does_nothing():
    gc.unfreeze()
    bulk_imports.resume()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    bulk_imports.pause()
    with collector_paused():  # e.g. the actor's framework import, inside a preload that paused it: the preload resumes
        pass
    assert not gc.isenabled()
    bulk_imports.resume()
    assert gc.isenabled() and gc.get_freeze_count() > 0
