"""Imported last by every worker process of a lean local Ray (Ray's ``preload_python_modules``): the preload
is done; collect once, freeze, and resume the cyclic collector (``bulk_imports.py``). Imported nowhere else."""

from trainlib._internal.startup import bulk_imports

bulk_imports.resume()
