"""A run's configuration as loggable params: flattened, secrets masked, long text cut. Driver only.

Free of any tracking library, so it is unit-tested fast and reusable by other trackers.
"""

from __future__ import annotations

import json
from typing import Any

from trainlib._internal.util.masking import REDACTED, is_secret_key, redact_text

TRUNCATED_SUFFIX = "...[truncated]"


def truncate(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, marked as truncated when it was cut."""
    if len(text) <= limit:
        return text
    return text[: max(0, limit - len(TRUNCATED_SUFFIX))] + TRUNCATED_SUFFIX


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested dicts into dotted keys: ``{"a": {"b": 1}}`` -> ``{"a.b": 1}``.

    Lists, tuples and other values stay leaves (they are logged as their text).
    """
    flat: dict[str, Any] = {}
    if isinstance(config, dict):
        if not config and prefix:
            flat[prefix] = {}
        for key, value in config.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            flat.update(flatten(value, name))
    elif prefix:
        flat[prefix] = config
    return flat


def param_value(key: str, value: Any, max_length: int) -> str:
    """The text to log for one parameter: redacted if it is a secret, truncated to ``max_length``."""
    if is_secret_key(key):
        return REDACTED
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value, default=str)
        if isinstance(value, (list, tuple, dict))
        else str(value)
    )
    return truncate(redact_text(text), max_length)


def params_for_logging(sections: dict[str, Any], max_key_length: int, max_value_length: int) -> dict[str, str]:
    """Flatten every section into loggable ``key -> text`` params, secrets redacted, long text cut.

    ``sections`` maps a key prefix to a config dict; the prefix ``""`` logs a
    dict's keys as they are (used for ``train_loop_config``).
    """
    params: dict[str, str] = {}
    for prefix, config in sections.items():
        if config is None:
            continue
        for key, value in flatten(config, prefix).items():
            params[truncate(key, max_key_length)] = param_value(key, value, max_value_length)
    return params
