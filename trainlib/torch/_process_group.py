"""Forming the default process group, with gloo's transient connect failures retried. Runs in worker actors only.

gloo connects every pair of ranks when its process group is created, and that full-mesh
connect fails now and then with every rank alive ("Gloo connectFullMesh failed ...
Connection closed by peer"; PyTorch's own CI knows it as a flaky test): seen once in a loaded
run of this suite. A second try succeeds, but only if every rank tries again together, so the
ranks share one TCP store (rank 0 hosts it, as ``init_method="tcp://..."`` would) and, after
each try, each rank posts whether it joined; when any rank failed, the ones that joined leave
the group again and all try once more under a fresh key prefix of the store. nccl and other
errors are not retried.

Rank 0's store is opened before any rank starts (:func:`open_store`, called through the driver), as
torchrun's agent hosts its store before it starts the ranks: a rank that connects before the store
listens backs off, and torch's client retries at growing intervals (docs/benchmarks.md, "Start-up and memory
(kept)"), while which rank finishes importing the user's modules first is chance.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import Callable
from typing import Any

from trainlib._internal import tunables

logger = logging.getLogger("trainlib")

_TRANSIENT_SIGN = "connectFullMesh"  # gloo's message for a failed pairwise connect at group creation


def open_store(host: str, world_size: int, timeout: datetime.timedelta) -> Any:
    """Rank 0's TCP store, listening at once on a port the system picks (its ``port``); waits for nobody."""
    import torch.distributed as dist

    return dist.TCPStore(host, 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)


def init_process_group(
    backend: str,
    master_addr: str,
    master_port: int,
    rank: int,
    world_size: int,
    timeout: datetime.timedelta,
    device_id: Any = None,
    attempts: int = tunables.GLOO_CONNECT_ATTEMPTS,
    init: Callable[..., None] | None = None,
    store: Any = None,
) -> None:
    """``torch.distributed.init_process_group`` for this rank; gloo's connect failures retried by all ranks at once.

    ``init``: the function that creates the group (``torch.distributed.init_process_group``; tests
    pass a wrapper that fails). ``store``: rank 0's store from :func:`open_store`, already listening
    at ``master_port``; without it rank 0 opens one there now.
    """
    import torch.distributed as dist

    init = init or dist.init_process_group
    if store is None:
        store = dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout)
    extra = {"device_id": device_id} if device_id is not None else {}
    tries = attempts if backend == "gloo" else 1
    for attempt in range(1, tries + 1):
        prefix = f"trainlib/pg{attempt}"
        error: RuntimeError | None = None
        try:
            init(
                backend=backend,
                store=dist.PrefixStore(prefix, store),
                rank=rank,
                world_size=world_size,
                timeout=timeout,
                **extra,
            )
        except RuntimeError as exc:
            if tries == 1 or _TRANSIENT_SIGN not in str(exc):
                raise
            error = exc
        if tries == 1:  # nothing to retry (nccl, or one try asked for): no verdict round over the store
            return
        store.set(f"{prefix}/joined/{rank}", "0" if error else "1")
        verdicts = [f"{prefix}/joined/{r}" for r in range(world_size)]
        store.wait(verdicts, timeout)
        failed = [r for r, key in enumerate(verdicts) if store.get(key) != b"1"]
        if not failed:
            return
        if error is None:
            dist.destroy_process_group()  # joined, but a peer did not: leave, to try again together
        if attempt == tries:
            _leave_store_last(store, prefix, rank, world_size)
            raise error or RuntimeError(
                f"The gloo process group could not be formed in {tries} tries: rank(s) {failed} failed to connect "
                "(see their errors). Check that the nodes can reach each other on all ports, or set "
                "GLOO_SOCKET_IFNAME to the interface they share."
            )
        logger.warning(
            "Forming the gloo process group failed on rank(s) %s (try %d of %d), trying again: %s",
            failed,
            attempt,
            tries,
            str(error).splitlines()[0][:200] if error else "a peer failed",
        )


def _leave_store_last(store: Any, prefix: str, rank: int, world_size: int) -> None:
    """Before every rank raises after the last try: rank 0, which hosts the store, waits (briefly) until
    the others have read the verdicts, or they would see its exit ("Failed to recv ... Connection
    closed") instead of the error that names the rank that failed."""
    store.set(f"{prefix}/read/{rank}", "1")
    if rank == 0:
        with contextlib.suppress(RuntimeError):  # a peer that died never acknowledges: raise anyway
            store.wait(
                [f"{prefix}/read/{r}" for r in range(world_size)],
                datetime.timedelta(seconds=tunables.GLOO_VERDICT_READ_TIMEOUT_S),
            )
