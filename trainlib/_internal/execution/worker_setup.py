"""Imported first by every worker process of the embedded Ray that trainlib starts (Ray's
``preload_python_modules``), before the process runs anything: sets the process up. Imported
nowhere else."""

from trainlib._internal.execution.lazy_arrow import defer_arrow_serializers

defer_arrow_serializers()
