"""The user's training function bound to its config: checked and pickled once on the driver, loaded in workers.

The driver binds the function once (``TrainFunction.bind``): the signature check,
the decision whether the function takes the config (``{}`` when it does and none
was given), and the one pickling, which is also the check that it can be sent.
The same bytes are stored in the run folder for ``restore`` and put once into
Ray's object store for every worker of every attempt.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

# Ray's copy of cloudpickle, as Ray Train's: it keeps the function's file name, so a worker's traceback shows the
# user's file and line (upstream cloudpickle 3.1 writes "<dynamic-code>"), and modules a user registered with
# ray.cloudpickle.register_pickle_by_value ship by value, as under Ray Train.
from ray import cloudpickle

from trainlib._internal.execution import user_code


@dataclasses.dataclass(frozen=True)
class TrainFunction:
    """``train_loop_per_worker`` and the config it is called with, pickled together once."""

    payload: bytes  # cloudpickle of (function, config the user gave, config to call with or None)
    driver_sys_path: tuple[str, ...]
    user_modules: tuple[str, ...] = ()  # the user's own modules it needs (see user_code), probed on each node

    @classmethod
    def bind(cls, func: Callable, config: dict | None) -> TrainFunction:
        """Check ``func`` against ``config`` and pickle them; TypeError naming the culprit and the fix."""
        if config is not None and not isinstance(config, dict):
            raise TypeError(
                f"train_loop_config must be a dict, got {type(config).__name__}: "
                "e.g. train_loop_config={'lr': 1e-3, 'epochs': 10}."
            )
        takes_config = _check_signature(func, config)
        call_config = (config if config is not None else {}) if takes_config else None
        try:
            payload = cloudpickle.dumps((func, config, call_config))
        except Exception as exc:  # noqa: BLE001 - narrowed to the culprit
            raise _unpicklable(func, config, exc) from None
        return cls(payload=payload, driver_sys_path=tuple(sys.path), user_modules=tuple(user_code.user_modules(func)))

    def by_value(self, modules: list[str]) -> TrainFunction:
        """The same function pickled with ``modules`` by value, for nodes that cannot import them (driver)."""
        return dataclasses.replace(self, payload=user_code.dumps_for_workers(cloudpickle.loads(self.payload), modules))

    def unpack(self) -> tuple[Callable, dict | None]:
        """The function and the config as the user gave them (for ``restore``)."""
        func, config, _ = cloudpickle.loads(self.payload)
        return func, config

    @staticmethod
    def in_process(func: Callable, config: dict | None) -> Callable[[], Any]:
        """``func`` itself (no pickling), ready to call with no arguments as ``load`` would give it (local mode)."""
        if _check_signature(func, config):
            call_config = config if config is not None else {}
            return lambda: func(call_config)
        return func

    def load(self) -> Callable[[], Any]:
        """In a worker: the function ready to call with no arguments."""
        extend_sys_path(self.driver_sys_path)
        try:
            func, _, call_config = cloudpickle.loads(self.payload)
        except ModuleNotFoundError as exc:
            raise ModuleNotFoundError(
                f"{exc}: the training function refers to a module that this worker cannot import (trainlib "
                "ships the function's own modules, not installed packages). Install it on every node, or ship it with ray.init(runtime_env={'py_modules': [...]}) "
                "or {'working_dir': ...}."
            ) from exc
        if call_config is None:
            return func
        return lambda: func(call_config)


def extend_sys_path(driver_sys_path: tuple[str, ...] | list[str]) -> None:
    """In a worker: add the driver's import path entries that exist here.

    On the driver's node the driver's import path exists too: use it, so a function from a
    module next to the user's script (or a test module) imports here as it does there.
    """
    for entry in driver_sys_path:
        if entry and entry not in sys.path and os.path.isdir(entry):
            sys.path.append(entry)


def _check_signature(func: Callable, config: dict | None) -> bool:
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


class UnpicklableError(TypeError):
    """The training function or its config cannot be pickled (local mode runs it anyway: nothing is sent)."""


def _unpicklable(func: Callable, config: dict | None, error: Exception) -> UnpicklableError:
    """The error that names what cannot be pickled: a config entry, the config, or the function."""
    for what, value in (("train_loop_config", config), ("train_loop_per_worker", func)):
        try:
            cloudpickle.dumps(value)
            continue
        except Exception as exc:  # noqa: BLE001 - narrowed further for dicts
            error = exc
        if isinstance(value, dict):
            for key, item in value.items():
                try:
                    cloudpickle.dumps(item)
                except Exception as exc:  # noqa: BLE001
                    return UnpicklableError(
                        f"{what}[{key!r}] ({type(item).__name__}) cannot be serialised to send to the workers: "
                        f"{exc}. Pass plain values (numbers, strings, lists, dicts) and build objects such as "
                        "models, data loaders or locks inside train_loop_per_worker."
                    )
        if what == "train_loop_config":
            return UnpicklableError(
                f"train_loop_config cannot be serialised to send to the workers: {error}. Pass plain values "
                "(numbers, strings, lists, dicts) and build other objects inside train_loop_per_worker."
            )
        break
    return UnpicklableError(
        f"train_loop_per_worker cannot be serialised to send to the workers: {error}. Make it a plain "
        "module-level function and build unpicklable objects (locks, open files, clients) inside it."
    )
