"""Tracking helpers that need no tracking library: params, secrets, the offline spool. Driver only.

``trainlib.mlflow`` builds on these; they are kept free of any ``mlflow``
import so that they can be unit-tested fast and reused by other trackers.
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.parse
from typing import Any, Iterable

REDACTED = "[REDACTED]"
TRUNCATED_SUFFIX = "...[truncated]"

# A key whose name contains one of these words holds a secret: its value is never logged.
SECRET_KEY_WORDS = ("key", "secret", "token", "password", "passwd", "credential")

# Values that are secrets whatever their key is called.
_SECRET_VALUE_PATTERNS = (
    re.compile(r"\bAKIA[0-9A-Z]{16}\b"),  # AWS access key id
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    re.compile(r"\b(ghp|gho|ghs|github_pat)_[A-Za-z0-9_]{20,}"),  # GitHub tokens
    re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"),  # API keys in the sk-... style
    re.compile(r"\bBearer\s+[A-Za-z0-9._~+/=-]{16,}", re.IGNORECASE),
)
_URL_WITH_PASSWORD = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*):([^/\s@]+)@")


def is_secret_key(key: str) -> bool:
    """Whether a (possibly dotted) parameter name looks like it names a secret."""
    lowered = key.lower()
    return any(word in lowered for word in SECRET_KEY_WORDS)


def redact_text(text: str) -> str:
    """``text`` with URL passwords and well-known secret formats replaced by ``[REDACTED]``."""
    text = _URL_WITH_PASSWORD.sub(lambda m: f"{m.group(1)}:{REDACTED}@", text)
    for pattern in _SECRET_VALUE_PATTERNS:
        text = pattern.sub(REDACTED, text)
    return text


def redact_url(url: str) -> str:
    """``url`` without the password of its user-info part (``http://u:p@host`` -> ``http://u:[REDACTED]@host``)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return redact_text(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:{REDACTED}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


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
    text = value if isinstance(value, str) else json.dumps(value, default=str) if isinstance(
        value, (list, tuple, dict)) else str(value)
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


class Spool:
    """An append-only JSON-lines file of tracking calls that could not be sent.

    Each line is one record, e.g. ``{"kind": "metrics", "run_id": ..., "step": 3,
    "metrics": {...}}``. Records are replayed in order; what still fails is
    written back, so a replay can be retried as often as needed.
    """

    def __init__(self, path: str):
        self.path = os.path.abspath(os.path.expanduser(path))
        self._lock = threading.Lock()

    def append(self, record: dict[str, Any]) -> None:
        with self._lock:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record, default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def read(self) -> list[dict[str, Any]]:
        if not os.path.exists(self.path):
            return []
        records = []
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line:
                    records.append(json.loads(line))
        return records

    def rewrite(self, records: Iterable[dict[str, Any]]) -> None:
        """Replace the spool's content with ``records`` (delete the file when there are none)."""
        records = list(records)
        with self._lock:
            if not records:
                if os.path.exists(self.path):
                    os.remove(self.path)
                return
            tmp = f"{self.path}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                for record in records:
                    f.write(json.dumps(record, default=str) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)

    def __len__(self) -> int:
        return len(self.read())


def describe_records(records: list[dict[str, Any]]) -> str:
    """A one-line account of spooled records: which metric steps and keys, artifacts, status."""
    parts = []
    steps = sorted({r["step"] for r in records if r["kind"] == "metrics"})
    if steps:
        keys = sorted({k for r in records if r["kind"] == "metrics" for k in r["metrics"]})
        parts.append(f"metrics {', '.join(keys)} at steps {_ranges(steps)}")
    params = sorted({k for r in records if r["kind"] == "params" for k in r["params"]})
    if params:
        parts.append(f"params {', '.join(params)}")
    tags = sorted({k for r in records if r["kind"] == "tags" for k in r["tags"]})
    if tags:
        parts.append(f"tags {', '.join(tags)}")
    artifacts = [r["artifact_path"] for r in records if r["kind"] == "artifacts"]
    if artifacts:
        parts.append(f"artifacts {', '.join(artifacts)}")
    statuses = [r["status"] for r in records if r["kind"] == "status"]
    if statuses:
        parts.append(f"the final status {statuses[-1]}")
    return "; ".join(parts) or "nothing"


def _ranges(steps: list[int]) -> str:
    """``[1, 2, 3, 5]`` -> ``"1-3, 5"``."""
    out, start, prev = [], steps[0], steps[0]
    for step in steps[1:] + [None]:
        if step is not None and step == prev + 1:
            prev = step
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if step is not None:
            start = prev = step
    return ", ".join(out)
