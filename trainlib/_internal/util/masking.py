"""Masking secrets: URL passwords, secret-looking values and secret-named keys. Driver and workers."""

from __future__ import annotations

import re
import urllib.parse

REDACTED = "[REDACTED]"

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
