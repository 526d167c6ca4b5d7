"""``TorchConfig``: torch.distributed settings. Built on the driver, read in worker actors."""

from __future__ import annotations

import dataclasses

from trainlib._internal import tunables


@dataclasses.dataclass
class TorchConfig:
    """torch.distributed settings.

    Args:
        backend: ``"gloo"``, ``"nccl"``, or None for nccl with GPUs and gloo without.
        timeout_s: process-group start-up and every collective fail after this
            many seconds, so a hung collective becomes a worker failure.
        init_method: ``"env"`` or ``"tcp"``, as in Ray Train. Both rendezvous the
            same way here: through a TCP store on rank 0, with ``MASTER_ADDR`` and
            ``MASTER_PORT`` set in every worker, so either value is accepted.
    """

    backend: str | None = None
    init_method: str = "env"
    timeout_s: float = tunables.DEFAULT_COLLECTIVE_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.backend not in (None, "gloo", "nccl"):
            raise ValueError(f"TorchConfig.backend={self.backend!r} is invalid: use 'gloo', 'nccl' or None (auto).")
        if self.init_method not in ("env", "tcp"):
            raise ValueError(f"TorchConfig.init_method={self.init_method!r} is invalid: use 'env' or 'tcp'.")
        if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) or self.timeout_s <= 0:
            raise ValueError(f"TorchConfig.timeout_s={self.timeout_s!r} is invalid: use a positive number of seconds.")
