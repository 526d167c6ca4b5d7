"""Reported metric values: checked in the worker, stored as JSON, read back as they were. Used on both sides.

As in Ray Train, ``report()`` takes any picklable value: numbers, strings,
lists, dicts, None, objects. Numbers (NumPy scalars included) become plain
Python numbers and NumPy arrays become lists; JSON values are stored as they
are, and any other picklable object is stored pickled inside the JSON, so
``Result.metrics`` and ``metrics_dataframe`` give back the object itself.
Only torch tensors are refused, as Ray Train refuses them (a tensor may hold
device memory and the whole autograd graph): report ``loss.item()``.
"""

from __future__ import annotations

import base64
import json
import numbers
from typing import Any

from trainlib._internal import tunables

PICKLED_KEY = "__trainlib_pickled__"
_MISSING = object()


def lookup_metric(metrics: dict[str, Any], name: str, default: Any = None) -> Any:
    """The metric ``name``, where a ``/`` path reaches into nested values as in Ray Train: ``"val/loss"`` is
    ``metrics["val/loss"]`` if reported under that name, else ``metrics["val"]["loss"]`` (list items by index)."""
    if name in metrics:
        return metrics[name]
    value: Any = metrics
    for part in name.split("/"):
        if isinstance(value, dict):
            value = value.get(part, _MISSING)
        elif isinstance(value, (list, tuple)) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            value = _MISSING
        if value is _MISSING:
            return default
    return value


def clean_metrics(metrics: Any) -> dict[str, Any]:
    """Check ``report(metrics)`` and return it with NumPy values made plain Python values."""
    if not isinstance(metrics, dict):
        raise TypeError(
            f"trainlib.report(metrics=...) takes a dict, got {type(metrics).__name__}. "
            "Report e.g. trainlib.report({'loss': loss.item(), 'epoch': epoch})."
        )
    clean: dict[str, Any] = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"trainlib.report(): metric names must be strings, got {key!r}.")
        if len(key) > tunables.MAX_METRIC_NAME_LENGTH:
            # Trackers refuse such names (MLflow: 250 characters) and with them the whole batch.
            raise ValueError(
                f"trainlib.report(): the metric name {_short(key)} has {len(key)} characters; at most "
                f"{tunables.MAX_METRIC_NAME_LENGTH} are allowed. Use a short name and put long text elsewhere."
            )
        clean[key] = _clean_value(key, value)
    return clean


def _clean_value(key: str, value: Any) -> Any:
    if type(value).__module__.startswith("torch"):
        hint = (
            "call .item() on it"
            if getattr(value, "ndim", 1) == 0
            else "report plain values (e.g. .item() or .tolist()), or save tensors in the checkpoint"
        )
        raise TypeError(f"trainlib.report(): metrics[{key!r}] is a torch tensor {_short(value)}: {hint}.")
    if type(value).__module__ == "numpy":
        return value.tolist()  # NumPy scalar -> int/float/bool, array -> (nested) list
    if isinstance(value, numbers.Number) and hasattr(value, "item"):
        return value.item()
    if isinstance(value, (list, tuple)):
        return type(value)(_clean_value(key, v) for v in value)
    if isinstance(value, dict):
        return {k: _clean_value(key, v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    from ray import cloudpickle

    try:
        cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the same fix
        raise TypeError(
            f"trainlib.report(): metrics[{key!r}] ({type(value).__name__}) cannot be pickled: {exc}. Report "
            "plain values (numbers, strings, lists) or picklable objects."
        ) from None
    return value


def is_number(value: Any) -> bool:
    """Whether ``value`` can be logged as a numeric metric: an int or float (a bool counts as 0/1)."""
    return isinstance(value, (int, float))


def _encode(value: Any) -> Any:
    """``json.dumps(default=...)``: a non-JSON value, pickled into a marker dict."""
    from ray import cloudpickle

    return {PICKLED_KEY: base64.b64encode(cloudpickle.dumps(value)).decode("ascii")}


def _decode(obj: dict) -> Any:
    """``json.loads(object_hook=...)``: a marker dict back to its value."""
    if len(obj) == 1 and PICKLED_KEY in obj:
        from ray import cloudpickle

        try:
            return cloudpickle.loads(base64.b64decode(obj[PICKLED_KEY]))
        except Exception as exc:  # noqa: BLE001 - a class that does not import here
            return f"<unreadable pickled value: {type(exc).__name__}: {exc}>"
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """JSON text of ``obj``, metric values that JSON cannot hold pickled inside it."""
    return json.dumps(obj, default=_encode, **kwargs)


def loads(text: str | bytes) -> Any:
    """The inverse of :func:`dumps`."""
    return json.loads(text, object_hook=_decode)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
