"""DDP's gradient allreduce through shared memory, for CPU ranks that all run on one node. Runs in worker actors only.

gloo sends every byte of a local allreduce through the kernel's TCP loopback: on the tutorial's
ResNet18 (43 MB of gradients) an allreduce of 2 ranks takes ~34 ms of a ~330 ms step, on the
same cores that train. Through a shared buffer the same sum takes ~14 ms (bench/bench_ddp.py):
each rank copies its bucket in, sums its own part of every rank's copy, and copies the summed
parts out. The ranks signal each other through pipes (one per ordered pair, a byte per phase), so
a phase waits in the kernel, not spinning on a core the other rank trains on.

The sum is the same for every rank: each part is summed once, by its owner, in rank order. With
2 ranks it is bit-identical to gloo's (``a + b == b + a``); with more, the order of the additions
may differ from gloo's in the last bit.

Used by ``prepare_model`` for DDP when the process group is gloo, the device the CPU and every
rank on this node; ``TorchConfig(shared_memory_allreduce=False)`` turns it off. A user's own
``register_comm_hook`` on the returned model replaces it. The buffer and the pipes are unlinked
from the file system as soon as every rank has opened them: nothing is left behind, even by a
crash.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import select
import shutil
import tempfile
from typing import Any, Callable

import torch
import torch.distributed as dist

from trainlib._internal import tunables

logger = logging.getLogger("trainlib")

_SHM_ROOT = "/dev/shm"  # tmpfs: the pages are memory, never written to a disk


class LocalAllreduce:
    """Sums flat CPU tensors across the ``world_size`` ranks of one node, in place.

    Built by every rank at once (:meth:`create`); every rank must then call :meth:`allreduce_` with
    tensors of the same size and dtype in the same order, as DDP's buckets are.
    """

    def __init__(self, rank: int, world_size: int, buffer: mmap.mmap, chunk_bytes: int,
                 to_peer: dict[int, int], from_peer: dict[int, int], timeout_s: float):
        self.rank = rank
        self.world_size = world_size
        self.chunk_bytes = chunk_bytes
        self._buffer = buffer
        self._bytes = torch.frombuffer(buffer, dtype=torch.uint8)
        self._to_peer = to_peer
        self._from_peer = from_peer
        self._timeout_s = timeout_s
        # Two halves used in turn: a rank may fill one for the next chunk while a slower rank still
        # reads the other, and the next chunk's first signal says every rank is done with it.
        self._turn = 0

    @classmethod
    def create(cls, group: Any = None, chunk_bytes: int = tunables.LOCAL_ALLREDUCE_CHUNK_BYTES,
               timeout_s: float = tunables.DEFAULT_COLLECTIVE_TIMEOUT_S) -> LocalAllreduce | None:
        """Set it up with the other ranks of ``group`` (a collective); None, on every rank, when any rank could
        not (no room for the buffer, say), with the reason logged: gloo then sums as before."""
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
        size = 2 * world_size * chunk_bytes
        folder = _make_folder(size, world_size) if rank == 0 else None
        shared = [folder]
        dist.broadcast_object_list(shared, src=0, group=group)
        folder = shared[0]
        opened: LocalAllreduce | None = None
        if folder is not None:
            try:
                opened = cls._open(folder, rank, world_size, size, chunk_bytes, timeout_s)
            except OSError as exc:
                logger.warning("Shared-memory allreduce unavailable on rank %d (%s): DDP uses gloo's.", rank, exc)
        # Every rank has opened the files (or failed) before they are removed; all agree on the outcome.
        ready = torch.tensor([0 if opened is None else 1], dtype=torch.int32)
        dist.all_reduce(ready, op=dist.ReduceOp.MIN, group=group)
        if rank == 0 and folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        dist.barrier(group=group)  # so that nothing is on disk once any rank returns
        if ready.item() == 1:
            return opened
        if opened is not None:
            opened.close()
        return None

    @classmethod
    def _open(cls, folder: str, rank: int, world_size: int, size: int, chunk_bytes: int,
              timeout_s: float) -> LocalAllreduce:
        fd = os.open(os.path.join(folder, "buffer"), os.O_RDWR)
        try:
            buffer = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        # O_RDWR: opening a pipe's either end then never waits for the other side to open it.
        peers = [p for p in range(world_size) if p != rank]
        to_peer = {p: os.open(os.path.join(folder, f"{rank}-{p}"), os.O_RDWR) for p in peers}
        from_peer = {p: os.open(os.path.join(folder, f"{p}-{rank}"), os.O_RDWR) for p in peers}
        return cls(rank, world_size, buffer, chunk_bytes, to_peer, from_peer, timeout_s)

    def allreduce_(self, flat: torch.Tensor) -> torch.Tensor:
        """Replace ``flat`` (contiguous, on the CPU) with its sum over the ranks; return it."""
        if not flat.is_contiguous() or flat.device.type != "cpu":
            raise ValueError("LocalAllreduce sums contiguous CPU tensors only.")
        flat = flat.view(-1)
        per_chunk = self.chunk_bytes // flat.element_size()
        for start in range(0, flat.numel(), per_chunk):
            self._allreduce_chunk(flat[start:start + per_chunk])
        return flat

    def _allreduce_chunk(self, piece: torch.Tensor) -> None:
        n, world, rank = piece.numel(), self.world_size, self.rank
        half = self._turn % 2
        self._turn += 1
        region = self._bytes[half * world * self.chunk_bytes:(half + 1) * world * self.chunk_bytes]
        slots = region.view(piece.dtype).view(world, -1)[:, :n]  # slots[r]: rank r's copy
        bounds = [n * r // world for r in range(world + 1)]
        slots[rank].copy_(piece)
        self._signal_and_wait()
        mine = slice(bounds[rank], bounds[rank + 1])
        total = slots[rank, mine]
        for other in range(world):
            if other != rank:
                total.add_(slots[other, mine])
        self._signal_and_wait()
        for owner in range(world):
            part = slice(bounds[owner], bounds[owner + 1])
            piece[part].copy_(slots[owner, part])

    def _signal_and_wait(self) -> None:
        """Tell every peer this rank reached the phase, and wait until each has told it the same."""
        for fd in self._to_peer.values():
            os.write(fd, b"\0")
        for peer, fd in self._from_peer.items():
            waiter = select.poll()  # not select(): a Ray worker's descriptors may number past its 1024
            waiter.register(fd, select.POLLIN)
            if not waiter.poll(self._timeout_s * 1000):
                raise RuntimeError(
                    f"Rank {self.rank} waited {self._timeout_s:.0f} s for rank {peer} in DDP's shared-memory "
                    "allreduce: that rank is stuck or gone, or the ranks reduce different buckets (every rank "
                    "must run the same backward passes). Set TorchConfig(timeout_s=...) to wait longer.")
            os.read(fd, 1)

    def close(self) -> None:
        for fd in (*self._to_peer.values(), *self._from_peer.values()):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._to_peer, self._from_peer = {}, {}
        del self._bytes  # the buffer can close only once no tensor views it
        with contextlib.suppress(BufferError):
            self._buffer.close()


def _make_folder(size: int, world_size: int) -> str | None:
    """Rank 0: a private folder with the shared buffer (its pages reserved now, so a full tmpfs fails
    here, not later with SIGBUS on first touch) and one pipe per ordered pair of ranks; None if it can't."""
    root = _SHM_ROOT if os.path.isdir(_SHM_ROOT) and os.access(_SHM_ROOT, os.W_OK) else tempfile.gettempdir()
    folder = None
    try:
        folder = tempfile.mkdtemp(prefix="trainlib-allreduce-", dir=root)
        fd = os.open(os.path.join(folder, "buffer"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
        for src in range(world_size):
            for dst in range(world_size):
                if src != dst:
                    os.mkfifo(os.path.join(folder, f"{src}-{dst}"), 0o600)
    except OSError as exc:
        logger.warning("Shared-memory allreduce unavailable (%s, %d bytes in %s): DDP uses gloo's.", exc, size, root)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        return None
    return folder


class LocalAllreduceHook:
    """The state of DDP's comm hook (:func:`local_allreduce_hook`): the shared-memory allreduce, or the
    user's own hook once they registered one on the model (:func:`install`)."""

    def __init__(self, allreduce: LocalAllreduce):
        self.allreduce: LocalAllreduce | None = allreduce
        self.user_hook: Callable[[Any, Any], Any] | None = None
        self.user_state: Any = None

    def hand_over(self, state: Any, hook: Callable[[Any, Any], Any]) -> None:
        self.user_hook, self.user_state = hook, state
        if self.allreduce is not None:
            self.allreduce.close()
            self.allreduce = None


# Not annotated: DDP compares a hook's annotations with its types, and here they would be strings.
def local_allreduce_hook(state, bucket):
    """The bucket summed through shared memory and averaged over the ranks, as DDP's default hook does."""
    if state.user_hook is not None:
        return state.user_hook(state.user_state, bucket)
    buffer = bucket.buffer()
    # Divided first, as DDP's own allreduce does: the same bits as gloo's for 2 ranks (and any power of 2).
    # Summed here, in the backward pass's thread: done in a thread of its own, so that backward went on
    # meanwhile, steps were slower (2 ranks on 2 cores; bench/bench_ddp.py).
    done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    done.set_result(state.allreduce.allreduce_(buffer.div_(state.allreduce.world_size)))
    return done


def install(model: torch.nn.parallel.DistributedDataParallel, allreduce: LocalAllreduce) -> LocalAllreduceHook:
    """Register the shared-memory allreduce as ``model``'s comm hook; a later ``model.register_comm_hook``
    replaces it (DDP's own would refuse a second hook)."""
    state = LocalAllreduceHook(allreduce)
    model.register_comm_hook(state, local_allreduce_hook)

    def register_comm_hook(user_state: object, hook: Callable) -> None:
        model._check_comm_hook(hook)
        model.logger._set_comm_hook_name(hook.__qualname__)
        model._comm_hooks[:] = [(hook, user_state)]
        state.hand_over(user_state, hook)

    model.register_comm_hook = register_comm_hook  # this instance only
    return state
