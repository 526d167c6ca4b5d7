"""Imported by every worker process of the embedded Ray that trainlib starts (Ray's
``preload_python_modules``), before the process runs anything else (only ``preload_begin`` comes
earlier): sets the process up. Imported nowhere else."""

from trainlib._internal.startup.lazy_serializers import defer_serialization_addons

defer_serialization_addons()
