"""Whether this process can write into a local folder, checked before work that would write there. Runs anywhere.

Permission bits alone do not tell (root, ACLs, a read-only mount, a full quota): the folder is made if missing
and a probe file written and removed.
"""

from __future__ import annotations

import os
import uuid


def folder_write_error(folder: str) -> OSError | None:
    """The error that making ``folder`` or writing a file in it raises, or None when it can be written."""
    probe = os.path.join(folder, f".write-probe-{os.getpid()}-{uuid.uuid4().hex}")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as exc:
        return exc
    return None
