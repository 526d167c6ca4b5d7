"""Tracker-independent helpers behind ``trainlib.mlflow``: params for logging, the offline spool. Driver only."""
