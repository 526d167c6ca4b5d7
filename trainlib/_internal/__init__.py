"""trainlib's machinery: nothing here is public API. Used on the driver and in worker actors.

- ``execution/``: the trainer's ``fit()``, the controller, the worker group, the worker actor and its session.
- ``storage/``: the run folder, checkpoint commits, retention, the run record.
- ``tracking/``: tracker-independent helpers (params, the offline spool) behind ``trainlib.mlflow``.
- ``util/``: small shared helpers (retries, filesystems, masking), each defined once.
- ``tunables.py``: every timeout, retry count and size.
"""
