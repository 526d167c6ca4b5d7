"""Masking secrets: URL passwords, secret-looking values and secret-named keys. Driver and workers."""

from __future__ import annotations

import base64
import dataclasses
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
# A URL with user-info: the password may hold any character but whitespace, '/', '?', '#' and '@' included,
# so the user-info runs to the last '@' of the URL.
_URL_WITH_USERINFO = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)(\S+)@(\S*)")


def is_secret_key(key: str) -> bool:
    """Whether a (possibly dotted) parameter name looks like it names a secret."""
    lowered = key.lower()
    return any(word in lowered for word in SECRET_KEY_WORDS)


def redact_text(text: str) -> str:
    """``text`` with URL credentials and well-known secret formats replaced by ``[REDACTED]``."""
    text = _URL_WITH_USERINFO.sub(lambda m: redact_url(m.group(0)), text)
    for pattern in _SECRET_VALUE_PATTERNS:
        text = pattern.sub(REDACTED, text)
    return text


@dataclasses.dataclass(frozen=True)
class UrlCredentials:
    """A URL split into the URL without its user-info and the user name and password it held (None: none)."""

    url: str
    username: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)

    @property
    def basic_auth(self) -> str | None:
        """The ``Authorization`` header value for HTTP basic auth, None without credentials."""
        if self.username is None:
            return None
        token = base64.b64encode(f"{self.username}:{self.password or ''}".encode()).decode("ascii")
        return f"Basic {token}"


def split_credentials(url: str) -> UrlCredentials:
    """``url`` without its ``user:password@`` (the password may hold any character: the user-info runs to the URL's
    last ``@``), and the user name and password, percent-decoded as a URL's user-info is."""
    scheme, sep, rest = url.partition("://")
    at = rest.rfind("@")
    if not sep or at == -1:
        return UrlCredentials(url)
    userinfo, host = rest[:at], rest[at + 1 :]
    if ":" not in userinfo and any(c in userinfo for c in "/?#"):
        return UrlCredentials(url)  # an '@' in the path (s3://bucket/file@v2), no user-info
    user, colon, password = userinfo.partition(":")
    return UrlCredentials(
        f"{scheme}://{host}", urllib.parse.unquote(user), urllib.parse.unquote(password) if colon else None
    )


def redact_url(url: str) -> str:
    """``url`` safe to print: its password (or a lone user name, which may be a token) and its query values masked.

    ``http://bob:pa#ss/w?d@host/x?token=t`` -> ``http://bob:[REDACTED]@host/x?token=[REDACTED]``. The password may
    hold any character: the user-info runs to the URL's last ``@``. A path holding an ``@`` (``s3://b/f@v2``) is
    left alone; anything that is not a URL is returned as it is. The one masking helper of trainlib, the pipeline
    and its flows (``trainlib.masking``).
    """
    scheme, sep, rest = url.partition("://")
    if not sep or not scheme or not scheme.replace("+", "").replace(".", "").replace("-", "").isalnum():
        return url
    at = rest.rfind("@")
    if at != -1:
        userinfo, host = rest[:at], rest[at + 1 :]
        if ":" in userinfo:
            rest = f"{userinfo.split(':', 1)[0]}:{REDACTED}@{host}"
        elif not any(c in userinfo for c in "/?#"):  # a lone user name: maybe a token (https://TOKEN@host)
            rest = f"{REDACTED}@{host}"
    path, qmark, query = rest.partition("?")
    if qmark:
        query, hash_mark, _fragment = query.partition("#")
        pairs = [p.partition("=") for p in query.split("&") if p]
        query = "&".join(f"{k}={REDACTED}" if eq else k for k, eq, _ in pairs)
        rest = f"{path}?{query}" + ("#" if hash_mark else "")
    return f"{scheme}://{rest}"
