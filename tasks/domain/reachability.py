"""Whether every node of a Ray cluster can reach the addresses a pipeline run hands it. Runs on the driver.

A Ray worker on another machine cannot reach this machine's loopback address,
open this machine's SQLite file or see its local folders. When some node of the
cluster is on another host, :func:`check_reachable` refuses a loopback Prefect
API URL or MLflow server, a SQLite (or plain file) MLflow store, a plain local
storage path and local mirror folders before any work starts, and says what to
use instead. Nodes
whose IPs belong to this machine (loopback addresses included) are local: they
share its network and files. Prefect-free: the flow calls it with the cluster's
node IPs.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import urllib.parse
from collections.abc import Iterable

from tasks.domain.urls import mask_url
from trainlib.masking import split_credentials

LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


class UnreachableFromClusterError(ValueError):
    """Some address of the run exists only on this machine, but the cluster has nodes elsewhere."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """One address the remote nodes cannot use: the setting, its value and what to use instead."""

    setting: str
    value: str
    fix: str

    def __str__(self) -> str:
        return f"- {self.setting}={mask_url(self.value)!r}: {self.fix}"


def local_addresses() -> set[str]:
    """This machine's IP addresses (every interface's, and what its host name resolves to)."""
    addresses = {"127.0.0.1", "::1"}
    try:
        import psutil

        for entries in psutil.net_if_addrs().values():
            addresses.update(e.address.split("%")[0] for e in entries if e.family in (socket.AF_INET, socket.AF_INET6))
    except ImportError:  # psutil comes with ray[default]; without it, fall back on name resolution
        pass
    try:
        addresses.update(info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None))
    except OSError:
        pass
    return addresses


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (a name or an IP) means "this machine" to whoever resolves it."""
    if not host:
        return False
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES or host == "0.0.0.0":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def remote_nodes(node_ips: Iterable[str], local: set[str] | None = None) -> list[str]:
    """The node IPs that are not this machine's (loopback addresses are this machine's)."""
    local = local_addresses() if local is None else local
    return sorted({ip for ip in node_ips if not is_loopback(ip) and ip not in local})


def problems(
    prefect_api_url: str | None,
    mlflow_tracking_uri: str | None,
    storage_path: str | None,
    node_hint: str,
    mirrors: Iterable[str] = (),
) -> list[Problem]:
    """What in these settings a node on another host could not reach."""
    found: list[Problem] = []
    if prefect_api_url and is_loopback(urllib.parse.urlsplit(split_credentials(prefect_api_url).url).hostname):
        found.append(
            Problem(
                "PREFECT_API_URL",
                prefect_api_url,
                f"a loopback address reaches only this machine. Start the server on an address {node_hint} can reach "
                "(prefect server start --host 0.0.0.0) and set PREFECT_API_URL=http://<this host's IP or name>:4200/api,"
                " or use Prefect Cloud.",
            )
        )
    if mlflow_tracking_uri and mlflow_tracking_uri.split(":")[0] not in ("databricks", "databricks-uc"):
        # Without its user-info: a password may hold '#', '/' or '?', which urlsplit reads as the URL's end.
        parts = urllib.parse.urlsplit(split_credentials(mlflow_tracking_uri).url)
        if parts.scheme in ("sqlite", "file", "") or (len(parts.scheme) == 1 and mlflow_tracking_uri[1:3] == ":\\"):
            found.append(
                Problem(
                    "mlflow_tracking_uri",
                    mlflow_tracking_uri,
                    f"a local store that {node_hint} cannot open. Run an MLflow server with a database and shared "
                    "artifacts (mlflow server --backend-store-uri postgresql://... --artifacts-destination s3://... "
                    "--host 0.0.0.0) and pass its URL, e.g. http://mlflow.internal:5000.",
                )
            )
        elif parts.scheme in ("http", "https") and is_loopback(parts.hostname):
            found.append(
                Problem(
                    "mlflow_tracking_uri",
                    mlflow_tracking_uri,
                    f"a loopback address reaches only this machine. Serve MLflow on an address {node_hint} can reach "
                    "(mlflow server --host 0.0.0.0) and pass http://<this host's IP or name>:<port>.",
                )
            )
    if storage_path and "://" not in storage_path:
        found.append(
            Problem(
                "storage_path",
                storage_path,
                f"a local folder that {node_hint} cannot see. Use shared storage: s3://bucket/prefix (or gs://, "
                "abfs://), or a folder mounted at the same path on every node (NFS) written as a file:// URL, "
                "which declares it shared: file:///mnt/shared/runs.",
            )
        )
    for mirror in mirrors or ():
        if "://" not in mirror:
            found.append(
                Problem(
                    "mirrors",
                    mirror,
                    f"a local folder that {node_hint} cannot see (the download step may run there). Serve it over "
                    "http(s)://, copy it to s3://, or leave mirrors unset to use the official mirrors.",
                )
            )
    return found


def check_reachable(
    node_ips: Iterable[str],
    *,
    prefect_api_url: str | None,
    mlflow_tracking_uri: str | None,
    storage_path: str | None,
    mirrors: Iterable[str] = (),
    local: set[str] | None = None,
) -> None:
    """Refuse addresses that only this machine has when the cluster has nodes on other hosts.

    Args:
        node_ips: the IPs of the cluster's alive nodes (``ray.nodes()``).
        prefect_api_url, mlflow_tracking_uri, storage_path, mirrors: what the run would hand the nodes.
        local: this machine's addresses (default: :func:`local_addresses`).

    Raises:
        UnreachableFromClusterError: naming each setting, its value and what to use instead.
    """
    remote = remote_nodes(node_ips, local)
    if not remote:
        return
    hint = "node " + ", ".join(remote[:5]) + (f" and {len(remote) - 5} more" if len(remote) > 5 else "")
    found = problems(prefect_api_url, mlflow_tracking_uri, storage_path, hint, mirrors)
    if found:
        raise UnreachableFromClusterError(
            f"The Ray cluster has nodes on other hosts ({', '.join(remote[:5])}), which cannot use these "
            "settings of this run:\n" + "\n".join(str(p) for p in found)
        )
