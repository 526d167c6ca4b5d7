"""Credentials kept out of the pipeline's parameters, which Prefect stores in clear. Runs in the command's process
(moving them) and in the steps (finding them).

A mirror URL or MLflow tracking URI given with ``user:password@`` is stripped before the flow run is
created; the credentials go to this process's environment, which the steps' Ray workers on this machine
inherit: MLflow's own ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``, and for mirrors
:data:`MIRROR_CREDENTIALS_ENV_VAR` (JSON: ``{"<mirror URL without credentials>": {"username": ...,
"password": ...}}``). On a cluster, set those variables on every node instead.

Example::

    notes = move_credentials_to_environment(values)  # values["mirrors"] and ["mlflow_tracking_uri"] stripped
    header = mirror_authorization("http://mirror:8080/data/t10k-labels-idx1-ubyte.gz")  # "Basic ..." or None
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable
from typing import Any

from tasks.domain.urls import mask_url
from trainlib.masking import split_credentials

MIRROR_CREDENTIALS_ENV_VAR = "TRAINLIB_MIRROR_CREDENTIALS"
MLFLOW_USERNAME_ENV_VAR = "MLFLOW_TRACKING_USERNAME"
MLFLOW_PASSWORD_ENV_VAR = "MLFLOW_TRACKING_PASSWORD"


def holds_credentials(url: str | None) -> bool:
    """Whether ``url`` carries a user name or password (``scheme://user:password@host``)."""
    return bool(url) and split_credentials(url).username is not None


def credential_fields(
    mirrors: Iterable[str] | None, mlflow_tracking_uri: str | None, data: str | None = None
) -> list[str]:
    """The parameters among these that hold credentials, as ``name=<masked value>``."""
    found = [f"mirrors={mask_url(m)!r}" for m in mirrors or () if holds_credentials(m)]
    if holds_credentials(mlflow_tracking_uri):
        found.append(f"mlflow_tracking_uri={mask_url(mlflow_tracking_uri)!r}")
    if holds_credentials(data):
        found.append(f"data={mask_url(data)!r}")
    return found


def move_credentials_to_environment(values: dict[str, Any]) -> list[str]:
    """Strip credentials from ``values["mirrors"]`` and ``values["mlflow_tracking_uri"]`` (in place) into this
    process's environment; return one sentence per URL moved, for the user."""
    notes = []
    mirrors = values.get("mirrors") or []
    stored = _mirror_credentials()
    for i, mirror in enumerate(mirrors):
        parts = split_credentials(mirror)
        if parts.username is None:
            continue
        stored[parts.url] = {"username": parts.username, "password": parts.password or ""}
        mirrors[i] = parts.url
        notes.append(
            f"The credentials of mirror {mask_url(mirror)} were moved to ${MIRROR_CREDENTIALS_ENV_VAR} of this "
            "process (the flow run's parameters never hold them)."
        )
    if stored:
        os.environ[MIRROR_CREDENTIALS_ENV_VAR] = json.dumps(stored)
    uri = values.get("mlflow_tracking_uri")
    if holds_credentials(uri):
        parts = split_credentials(uri)
        os.environ[MLFLOW_USERNAME_ENV_VAR] = parts.username or ""
        os.environ[MLFLOW_PASSWORD_ENV_VAR] = parts.password or ""
        values["mlflow_tracking_uri"] = parts.url
        notes.append(
            f"The credentials of the MLflow URI {mask_url(uri)} were moved to ${MLFLOW_USERNAME_ENV_VAR} and "
            f"${MLFLOW_PASSWORD_ENV_VAR} of this process, where MLflow reads them (the flow run's parameters "
            "never hold them)."
        )
    return notes


def mirror_authorization(url: str) -> str | None:
    """The HTTP ``Authorization`` header for fetching ``url``: from its own user-info, else from the credentials
    stored for the longest mirror URL it starts with (:data:`MIRROR_CREDENTIALS_ENV_VAR`); None for none."""
    own = split_credentials(url).basic_auth
    if own is not None:
        return own
    matches = [base for base in _mirror_credentials() if url.startswith(base.rstrip("/") + "/") or url == base]
    if not matches:
        return None
    found = _mirror_credentials()[max(matches, key=len)]
    token = base64.b64encode(f"{found.get('username', '')}:{found.get('password', '')}".encode()).decode("ascii")
    return f"Basic {token}"


def _mirror_credentials() -> dict[str, dict[str, str]]:
    text = os.environ.get(MIRROR_CREDENTIALS_ENV_VAR, "").strip()
    if not text:
        return {}
    try:
        stored = json.loads(text)
    except ValueError:
        raise ValueError(
            f"${MIRROR_CREDENTIALS_ENV_VAR} is not JSON. Set it to "
            '{"http://mirror/path/": {"username": "...", "password": "..."}}, or unset it.'
        ) from None
    return {str(k): dict(v) for k, v in stored.items()} if isinstance(stored, dict) else {}
