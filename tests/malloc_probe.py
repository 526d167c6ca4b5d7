"""What a training step's memory costs in page faults: the probe of trainlib's malloc settings (allocator.py).

Importable by a test's subprocesses and Ray workers once this folder is on their path.
"""

from __future__ import annotations

BLOCKS = 24  # of 1 MB: 24 * 256 pages of 4 KB
PAGES = BLOCKS * 256


def refaulted_pages() -> int:
    """Page faults when 24 MB freed in 1 MB blocks are allocated and touched again (a step's pattern).

    With glibc's defaults most of the 6,144 pages went back to the kernel and fault in again; kept by
    trainlib's settings, (almost) none do.
    """
    import ctypes
    import resource

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    faults = []
    for _ in range(2):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [libc.malloc(1 << 20) for _ in range(BLOCKS)]
        for block in blocks:
            ctypes.memset(block, 1, 1 << 20)
        for block in reversed(blocks):
            libc.free(block)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return faults[1]
