"""Reported metric values: checked in the worker, stored as JSON, read back as they were. Used on both sides.

``report()`` takes numbers, strings, None, lists, tuples, dicts and dates/times (``datetime.date``,
``datetime.datetime``, ``datetime.time``, ``datetime.timedelta``); NumPy scalars and arrays become
plain Python numbers and lists. Everything is stored as plain JSON: what JSON cannot say natively
(a tuple, a date, a dict with non-str keys, a dict that looks like one of these tags) is written as a
small tagged object ``{"__trainlib_type__": <kind>, "value": ...}`` and read back as it was.

Any other object is refused by ``report()``, naming the metric: reading a run must never run code,
so nothing is pickled into run storage. Runs written by earlier versions, which pickled such values,
read back with each pickled value as a string that names it; it is never unpickled. Torch tensors
are refused as Ray Train refuses them (a tensor may hold device memory and the autograd graph).
"""

from __future__ import annotations

import base64
import datetime
import json
import numbers
import pickletools
from typing import Any

from trainlib._internal import tunables

TYPE_KEY = "__trainlib_type__"
# The marker of a pickled value in runs of earlier versions (read back as a string, never unpickled).
PICKLED_KEY = "__trainlib_pickled__"
_SCALARS = (str, int, float, bool, type(None))
_TIMES = {
    "datetime": datetime.datetime,
    "date": datetime.date,
    "time": datetime.time,
    "timedelta": datetime.timedelta,
}
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
    """Check ``report(metrics)`` and return it as it will be stored (NumPy values made plain Python values).

    Raises:
        TypeError: naming the metric whose name, value or dict key cannot be stored.
    """
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
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return value.tolist()  # NumPy scalar -> int/float/bool, array -> (nested) list
    if isinstance(value, numbers.Number) and hasattr(value, "item") and not isinstance(value, _SCALARS):
        return value.item()
    if isinstance(value, list):
        return [_clean_value(key, v) for v in value]
    if isinstance(value, tuple):
        return tuple(_clean_value(key, v) for v in value)
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, _SCALARS):
                raise TypeError(
                    f"trainlib.report(): metrics[{key!r}] holds a dict with the key {_short(k)} "
                    f"({type(k).__name__}); dict keys in metrics must be str, int, float, bool or None. Use a "
                    f"string key, e.g. {_short(str(k))}."
                )
        return {k: _clean_value(key, v) for k, v in value.items()}
    if isinstance(value, _SCALARS) or type(value) in _TIMES.values():
        return value
    raise TypeError(
        f"trainlib.report(): metrics[{key!r}] is a {type(value).__module__}.{type(value).__qualname__}, which run "
        "storage does not hold: metrics are stored as JSON (numbers, strings, None, lists, tuples, dicts, "
        "dates and times), never pickled, so that reading a run never runs code. Report a number or a string, "
        f"e.g. str(value), or save the object in the checkpoint."
    )


def is_number(value: Any) -> bool:
    """Whether ``value`` can be logged as a numeric metric: an int or float (a bool counts as 0/1)."""
    return isinstance(value, (int, float))


def dumps(obj: Any, **kwargs: Any) -> str:
    """JSON text of ``obj``, what JSON cannot say natively written as tagged objects (see the module's doc)."""
    return json.dumps(_encode(obj), **kwargs)


def loads(text: str | bytes) -> Any:
    """The inverse of :func:`dumps`; never unpickles (an old run's pickled value comes back as a string)."""
    return json.loads(text, object_hook=_decode)


def _encode(value: Any) -> Any:
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and TYPE_KEY not in value and PICKLED_KEY not in value:
            return {k: _encode(v) for k, v in value.items()}
        return _tagged("dict", [[_encode(k), _encode(v)] for k, v in value.items()])
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return _tagged("tuple", [_encode(v) for v in value])
    for kind, cls in _TIMES.items():
        if type(value) is cls:
            return _tagged(kind, value.total_seconds() if kind == "timedelta" else value.isoformat())
    if isinstance(value, _SCALARS):
        return value
    raise TypeError(f"{type(value).__name__} values are not stored in run storage (see trainlib._internal.metrics)")


def _tagged(kind: str, value: Any) -> dict[str, Any]:
    return {TYPE_KEY: kind, "value": value}


def _decode(obj: dict) -> Any:
    """``json.loads(object_hook=...)``: a tagged object back to its value; an old pickled value to a string."""
    if len(obj) == 2 and TYPE_KEY in obj and "value" in obj:
        kind, value = obj[TYPE_KEY], obj["value"]
        if kind == "tuple":
            return tuple(value)
        if kind == "dict":
            return {k: v for k, v in value}
        if kind == "timedelta":
            return datetime.timedelta(seconds=value)
        if kind in _TIMES:
            return _TIMES[kind].fromisoformat(value)
    if len(obj) == 1 and isinstance(obj.get(PICKLED_KEY), str):
        return _pickled_placeholder(obj[PICKLED_KEY])
    return obj


def _pickled_placeholder(payload: str) -> str:
    """What an earlier version's pickled value reads back as: a string naming its class, found by reading the
    pickle's opcodes (pickletools runs nothing); the value itself is never unpickled."""
    name = "object"
    try:
        strings: list[str] = []
        for opcode, arg, _ in pickletools.genops(base64.b64decode(payload)):
            if opcode.name in ("GLOBAL", "INST"):
                name = str(arg).replace(" ", ".")
                break
            if isinstance(arg, str):
                strings.append(arg)
            if opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                name = f"{strings[-2]}.{strings[-1]}"
                break
    except Exception:  # noqa: BLE001 - a malformed payload: still only a string
        pass
    return f"<pickled {name}, not read: trainlib never unpickles run storage>"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
