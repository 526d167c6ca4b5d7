"""Connecting the driver to Ray, in seconds or with a clear error. Driver only.

``ray.init(address=...)`` on an address where no cluster listens retries the GCS for minutes
("Failed to connect to GCS ... within 5 seconds", over and over). A TCP probe of the address
first turns that into an error within ``RAY_CONNECT_TIMEOUT_S``.
"""

from __future__ import annotations

import socket

from trainlib._internal import tunables
from trainlib.errors import ResourcesUnavailableError


class RayUnreachableError(ResourcesUnavailableError):
    """The Ray cluster named by an address does not answer."""


def probe_ray_address(address: str | None, source: str = "RAY_ADDRESS") -> None:
    """Raise RayUnreachableError when ``address`` (``host:port`` or ``ray://host:port``) does not accept connections.

    ``None``, ``"auto"`` and ``"local"`` are left to Ray (they name no host to probe).
    """
    if not address or address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=tunables.RAY_CONNECT_TIMEOUT_S):
            return
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
    raise RayUnreachableError(
        f"No Ray cluster answers at {address} ({source}): {reason} within {tunables.RAY_CONNECT_TIMEOUT_S:.0f}s. "
        "Start the cluster (ray start --head) or fix the address; unset it to run on a local Ray started "
        "for this job."
    )
