"""``python -m trainlib SCRIPT [ARGS...]``: run a training script with the embedded Ray started before its imports.

``python SCRIPT`` imports the script's modules (torch, torchvision, ...) on one core, and only then
does ``fit()`` start Ray, whose workers import torch in turn. Started here first, Ray's workers
import torch on the other cores while the script imports its own, so the first step comes sooner
(docs/benchmarks.md, ``python -m trainlib SCRIPT``). Otherwise the script runs as
with ``python SCRIPT``: as ``__main__``, with its arguments, its folder first on the import path.

Nothing is started where ``fit()`` would not start Ray either (``RAY_ADDRESS`` set, a cluster). A
script that calls ``ray.init`` itself before any ``fit()`` gets the Ray it asks for: the one
started here is shut down first (:func:`trainlib._internal.startup.embedded_ray.give_way_to_user_ray`).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import runpy
import sys
from collections.abc import Callable, Sequence
from typing import Any

from trainlib._internal.startup.adapter import replaced_attribute
from trainlib._internal.startup.embedded_ray import give_way_to_user_ray, start_ahead_of_fit

logger = logging.getLogger("trainlib")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainlib",
        usage="python -m trainlib SCRIPT [ARGS...]",
        description="Run a training script as `python SCRIPT ARGS` does, with trainlib's local Ray (and its workers' "
        "torch import) started before the script's own imports.",
    )
    parser.add_argument("script", help="the training script's path")
    parser.add_argument("args", nargs="*", help="the script's own arguments, passed to it unchanged")
    return parser


def _giving_way(original: Callable[..., Any]) -> Callable[..., Any]:
    """``ray.init`` for the script: the user's call first shuts down the Ray started ahead of ``fit()``."""

    @functools.wraps(original)
    def init(*args: Any, **kwargs: Any) -> Any:
        if give_way_to_user_ray():
            logger.info("The script starts a Ray of its own: the one `python -m trainlib` started is shut down")
        return original(*args, **kwargs)

    return init


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if not argv:
        parser.error("the training script's path is missing")
    if argv[0] in ("-h", "--help"):  # only before SCRIPT: everything after it is the script's, its options too
        parser.print_help()
        return 0
    script, script_args = argv[0], argv[1:]
    if not os.path.isfile(script):
        parser.error(f"script {script!r}: no such file. Give the training script's path, as to `python SCRIPT`.")
    try:
        start_ahead_of_fit()
    except Exception as exc:  # noqa: BLE001 - fit() starts it (and reports why not) in the script's own context
        logger.warning(
            "Ray could not be started ahead of the script (%s); fit() starts it as without `python -m trainlib`", exc
        )
    import ray

    sys.argv = [script, *script_args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` puts it (here: the working folder)
    with replaced_attribute(ray, "init", _giving_way):
        runpy.run_path(script, run_name="__main__")
    return 0
