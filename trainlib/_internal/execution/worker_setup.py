"""Imported first by every worker process of the embedded Ray that trainlib starts (Ray's
``preload_python_modules``), before the process runs anything: sets the process up. Imported
nowhere else."""

from trainlib._internal.execution.lazy_serializers import defer_serialization_addons

defer_serialization_addons()
