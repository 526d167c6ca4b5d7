"""A benchmark's result files: ``<name>.json`` (every figure) and ``<name>.md`` (the table), the table printed too.

Imported by the scripts in this folder (run as ``python bench/<script>.py``, which puts this folder on the path).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any


def write_results(folder: str, name: str, payload: Any, lines: Sequence[str]) -> None:
    """Write ``payload`` to ``folder/<name>.json`` and ``lines`` to ``folder/<name>.md``; print the lines."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{name}.json"), "w") as f:
        json.dump(payload, f, indent=1)
    with open(os.path.join(folder, f"{name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
