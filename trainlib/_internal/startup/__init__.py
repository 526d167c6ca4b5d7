"""trainlib's start-up layer: a lean local Ray for ``fit()`` and the pipeline. Driver, and Ray workers' preload.

Separate from the run engine (``execution/``), which calls it through ``embedded_ray`` (connect to or start
Ray, stop it at exit), ``worker_preload`` (what a backend's workers preload) and ``bulk_imports``; the pipeline
calls it through the public ``trainlib.startup``. Every replacement of another library's attribute goes through
``adapter.py``, which names the versions it was checked on and holds the switch that turns the layer off
(``TRAINLIB_LEAN_STARTUP=0``). docs/startup.md lists the pieces.
"""
