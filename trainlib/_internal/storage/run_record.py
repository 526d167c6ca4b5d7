"""The run record ``trainlib_run.json``: a run's config and status. Driver only."""

from __future__ import annotations

RUN_STATE_FILE = "trainlib_run.json"
