"""Scoring a model on the test split: the evaluation report. Runs wherever the evaluate task runs (driver side).

No Prefect, no MLflow here.

Example::

    report = evaluate_model(network, images, labels, class_names)
    report.accuracy, report.markdown()
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from tasks.domain.classifier_network import forward_in_batches
from tasks.domain.network import to_inputs


@dataclasses.dataclass(frozen=True)
class EvaluationReport:
    """A model's scores on the test split.

    Attributes:
        accuracy: fraction of test images classified right.
        loss: mean cross-entropy.
        per_class_accuracy: class name -> accuracy on that class's images.
        confusion_matrix: ``[true][predicted]`` counts.
        class_names: the class names, in label order.
        num_images: how many test images were scored.
    """

    accuracy: float
    loss: float
    per_class_accuracy: dict[str, float]
    confusion_matrix: list[list[int]]
    class_names: tuple[str, ...]
    num_images: int

    def metrics(self) -> dict[str, float]:
        """Flat metrics for a tracking server: test accuracy, loss and one accuracy per class."""
        out = {"test_accuracy": self.accuracy, "test_loss": self.loss}
        for i, name in enumerate(self.class_names):
            out[f"test_accuracy_class_{i}"] = self.per_class_accuracy[name]
        return out

    def markdown(self, title: str = "Test-set evaluation") -> str:
        """A readable summary: headline scores and a per-class table."""
        rows = "\n".join(
            f"| {i} | {name} | {self.per_class_accuracy[name]:.2%} | {sum(self.confusion_matrix[i])} |"
            for i, name in enumerate(self.class_names)
        )
        return (
            f"# {title}\n\n"
            f"* **test accuracy**: {self.accuracy:.2%} on {self.num_images} images\n"
            f"* **test loss**: {self.loss:.4f}\n\n"
            f"| label | class | accuracy | images |\n|---|---|---|---|\n{rows}\n"
        )


def evaluate_model(
    model: torch.nn.Module,
    images: torch.Tensor,
    labels: torch.Tensor,
    class_names: Sequence[str],
    batch_size: int = 256,
) -> EvaluationReport:
    """Score ``model`` on uint8 ``images [N, 28, 28]`` with int ``labels [N]``.

    Raises:
        ValueError: no images, or images and labels of different lengths.
    """
    if len(images) == 0 or len(images) != len(labels):
        raise ValueError(
            f"evaluate_model needs as many labels as images, and at least one: got "
            f"{len(images)} images and {len(labels)} labels."
        )
    n_classes = len(class_names)
    # The registered model's forward passes (classifier_model.predict_probabilities), so both give the same labels.
    logits = forward_in_batches(model, images, to_inputs, batch_size)
    loss = torch.nn.functional.cross_entropy(logits, labels, reduction="mean").item()
    matrix = torch.bincount(labels * n_classes + logits.argmax(1), minlength=n_classes * n_classes).view(
        n_classes, n_classes
    )
    return report_from_confusion(matrix.tolist(), loss, class_names)


def report_from_confusion(matrix: list[list[int]], loss: float, class_names: Sequence[str]) -> EvaluationReport:
    """Build the report from a ``[true][predicted]`` confusion matrix (classes with no image score 0)."""
    total = sum(sum(row) for row in matrix)
    correct = sum(matrix[i][i] for i in range(len(matrix)))
    per_class = {name: (matrix[i][i] / sum(matrix[i]) if sum(matrix[i]) else 0.0) for i, name in enumerate(class_names)}
    return EvaluationReport(
        accuracy=correct / total if total else 0.0,
        loss=float(loss),
        per_class_accuracy=per_class,
        confusion_matrix=[list(r) for r in matrix],
        class_names=tuple(class_names),
        num_images=total,
    )
