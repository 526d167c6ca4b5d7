"""Checks of what a trainer is given, before anything starts: the training function, configs, metadata. Driver only."""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable

import cloudpickle


def check_train_func(func: Callable, config: dict | None) -> bool:
    """Validate the training function against the config; return whether it takes the config."""
    if not callable(func):
        raise TypeError(f"train_loop_per_worker must be a function, got {type(func).__name__}.")
    params = list(inspect.signature(func).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    takes_varargs = any(p.kind == p.VAR_POSITIONAL for p in params)
    name = getattr(func, "__name__", "train_loop_per_worker")
    if len(required) > 1:
        raise TypeError(
            f"train_loop_per_worker {name}{inspect.signature(func)} has {len(required)} required arguments; it "
            "may take at most one, the config dict: def train_func(config): ..."
        )
    if config is not None and not positional and not takes_varargs:
        raise TypeError(
            f"train_loop_config was given but train_loop_per_worker {name}() takes no arguments: define it "
            "as def train_func(config): ... to receive the config, or drop train_loop_config."
        )
    return bool(positional) or takes_varargs


def check_picklable(what: str, value: Any) -> None:
    try:
        cloudpickle.dumps(value)
        return
    except Exception as exc:  # noqa: BLE001 - narrowed to the culprit below
        error = exc
    if isinstance(value, dict):
        for key, item in value.items():
            try:
                cloudpickle.dumps(item)
            except Exception as exc:  # noqa: BLE001
                raise TypeError(
                    f"{what}[{key!r}] ({type(item).__name__}) cannot be serialised to send to the workers: "
                    f"{exc}. Pass plain values (numbers, strings, lists, dicts) and build objects such as "
                    "models, data loaders or locks inside train_loop_per_worker."
                ) from None
    raise TypeError(
        f"{what} cannot be serialised to send to the workers: {error}. Make it a plain module-level "
        "function and build unpicklable objects (locks, open files, clients) inside it."
    ) from None


def check_metadata(metadata: Any) -> None:
    """``metadata`` must be a JSON-able dict: it is written into every checkpoint's ``.metadata.json``."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict, got {type(metadata).__name__}: e.g. metadata={{'owner': 'me'}}.")
    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"metadata must be JSON-serialisable (it is stored with every checkpoint): {exc}.") from None
