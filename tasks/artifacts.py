"""Names of the Prefect artifacts the pipeline's tasks leave. Runs in the task processes.

Example::

    artifact_key("evaluation", "Fashion MNIST ResNet18")  # "evaluation-fashion-mnist-resnet18"
"""

from __future__ import annotations


def artifact_key(prefix: str, name: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) from free text."""
    cleaned = "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")
    return f"{prefix}-{'-'.join(filter(None, cleaned.split('-')))}"
