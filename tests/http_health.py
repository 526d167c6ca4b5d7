"""One health probe for the servers that tests start (Prefect, MLflow, Ray dashboard)."""

from __future__ import annotations

import urllib.request


def healthy(url: str) -> bool:
    """Whether ``url`` answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
