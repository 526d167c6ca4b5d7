"""The pipeline's Prefect tasks: thin wrappers of ``tasks.domain`` that add retries, logs and artifacts.

``flows/`` -> ``tasks/`` -> ``tasks/domain/`` and ``trainlib/``; nothing in ``tasks/domain``
imports Prefect.
"""
