"""Masking secrets in what is printed: URL credentials and query values, well-known secret formats. Anywhere.

The one masking helper of trainlib and of the pipeline (``flows``, ``tasks``): every URL that is
printed, logged or put in an error message goes through :func:`redact_url`, whatever characters its
password holds. This module is public but not part of the Ray Train API (it is not in ``trainlib.__all__``).

Example::

    from trainlib.masking import redact_url

    redact_url("http://bob:pa#ss@mirror:8080/data/")  # "http://bob:[REDACTED]@mirror:8080/data/"
    split_credentials("http://bob:pa#ss@mirror:8080/data/").url  # "http://mirror:8080/data/"
"""

from __future__ import annotations

from trainlib._internal.util.masking import REDACTED, UrlCredentials, redact_text, redact_url, split_credentials

__all__ = ["REDACTED", "UrlCredentials", "redact_text", "redact_url", "split_credentials"]
