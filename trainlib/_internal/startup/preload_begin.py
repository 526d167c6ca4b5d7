"""Imported first by every worker process of a lean local Ray (Ray's ``preload_python_modules``): the
bulk imports of the preload run without the cyclic collector (``bulk_imports.py``). Imported nowhere else."""

from trainlib._internal.startup import bulk_imports

bulk_imports.pause()
