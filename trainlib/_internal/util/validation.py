"""The number check every config shares: the field, the bad value and the fix in one message. Both sides."""

from __future__ import annotations

from typing import Any


def require_number(owner: str, field: str, value: Any, *, minimum: float, fix: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{owner}.{field} must be a number, got {value!r} ({type(value).__name__}). {fix}")
    if value < minimum:
        raise ValueError(f"{owner}.{field}={value!r} is invalid: {fix}")
