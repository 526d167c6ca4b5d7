"""A benchmark's result files: ``<name>.json`` (every figure) and ``<name>.md`` (the table), the table printed too.

Each benchmark keeps ONE latest result under its plain name (``overhead``, ``pipeline``, ...): a new run replaces
the files, and the history is git's. A name carrying a date or a clock time (``overhead_1207_1512``) is refused.
Imported by the scripts in this folder (run as ``python -m bench NAME`` or ``python bench/<script>.py``, which put
this folder on the path).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any

# Lower-case words joined by "_"; a run of 4 or more digits reads as a date or a clock time.
_PLAIN_NAME = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
_DATED = re.compile(r"\d{4}")
# Where every benchmark writes by default (each script's ``--results-dir`` or equivalent overrides it).
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def check_name(name: str) -> str:
    """Return ``name`` if it is a plain benchmark name; raise ValueError naming it and the fix otherwise."""
    if not _PLAIN_NAME.match(name) or _DATED.search(name):
        raise ValueError(
            f"result name {name!r} is not a plain benchmark name: use lower-case words joined by '_' and no date or "
            "time (e.g. 'overhead', 'pipeline_10ep'); each benchmark keeps its latest result only, git keeps the rest"
        )
    return name


def result_paths(folder: str, name: str) -> tuple[str, str]:
    """The (json, md) paths of benchmark ``name``'s result in ``folder``."""
    check_name(name)
    return os.path.join(folder, f"{name}.json"), os.path.join(folder, f"{name}.md")


def write_results(folder: str, name: str, payload: Any, lines: Sequence[str]) -> None:
    """Write ``payload`` to ``folder/<name>.json`` and ``lines`` to ``folder/<name>.md``; print the lines."""
    json_path, md_path = result_paths(folder, name)
    os.makedirs(folder, exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(payload, f, indent=1)
    with open(md_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


def plain_name(name: str) -> str:
    """``argparse`` type for a result-name option: a plain benchmark name, checked before anything runs."""
    import argparse

    try:
        return check_name(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
