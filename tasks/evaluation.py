"""Test-set evaluation and its pictures: plain functions, run by the pipeline's evaluate task.

Runs wherever the evaluate task runs (a Ray worker in the pipeline); no Prefect,
no MLflow here. Plots use matplotlib's Agg backend (no display needed).

Example::

    report = evaluate_model(load_model(folder), images, labels, class_names)
    plot_confusion_matrix(report, "confusion_matrix.png")
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from tasks.model import to_inputs


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
        rows = "\n".join(f"| {i} | {name} | {self.per_class_accuracy[name]:.2%} | {sum(self.confusion_matrix[i])} |"
                         for i, name in enumerate(self.class_names))
        return (f"# {title}\n\n"
                f"* **test accuracy**: {self.accuracy:.2%} on {self.num_images} images\n"
                f"* **test loss**: {self.loss:.4f}\n\n"
                f"| label | class | accuracy | images |\n|---|---|---|---|\n{rows}\n")


def evaluate_model(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor,
                   class_names: Sequence[str], batch_size: int = 256) -> EvaluationReport:
    """Score ``model`` on uint8 ``images [N, 28, 28]`` with int ``labels [N]``.

    Raises:
        ValueError: no images, or images and labels of different lengths.
    """
    if len(images) == 0 or len(images) != len(labels):
        raise ValueError(f"evaluate_model needs as many labels as images, and at least one: got "
                         f"{len(images)} images and {len(labels)} labels.")
    n_classes = len(class_names)
    matrix = torch.zeros(n_classes, n_classes, dtype=torch.int64)
    loss_sum = 0.0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(labels), batch_size):
            x = to_inputs(images[start:start + batch_size])
            y = labels[start:start + batch_size]
            logits = model(x)
            loss_sum += torch.nn.functional.cross_entropy(logits, y, reduction="sum").item()
            predicted = logits.argmax(1)
            matrix += torch.bincount(y * n_classes + predicted, minlength=n_classes * n_classes).view(
                n_classes, n_classes)
    return report_from_confusion(matrix.tolist(), loss_sum / len(labels), class_names)


def report_from_confusion(matrix: list[list[int]], loss: float, class_names: Sequence[str]) -> EvaluationReport:
    """Build the report from a ``[true][predicted]`` confusion matrix (classes with no image score 0)."""
    total = sum(sum(row) for row in matrix)
    correct = sum(matrix[i][i] for i in range(len(matrix)))
    per_class = {name: (matrix[i][i] / sum(matrix[i]) if sum(matrix[i]) else 0.0)
                 for i, name in enumerate(class_names)}
    return EvaluationReport(accuracy=correct / total if total else 0.0, loss=float(loss),
                            per_class_accuracy=per_class, confusion_matrix=[list(r) for r in matrix],
                            class_names=tuple(class_names), num_images=total)


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_confusion_matrix(report: EvaluationReport, path: str) -> str:
    """Write the confusion matrix as a PNG picture to ``path``; return ``path``."""
    plt = _pyplot()
    n = len(report.class_names)
    fig, ax = plt.subplots(figsize=(7.5, 6.5))
    try:
        image = ax.imshow(report.confusion_matrix, cmap="Blues")
        fig.colorbar(image, ax=ax)
        ax.set_xticks(range(n), report.class_names, rotation=45, ha="right")
        ax.set_yticks(range(n), report.class_names)
        ax.set_xlabel("predicted")
        ax.set_ylabel("true")
        ax.set_title(f"Confusion matrix (test accuracy {report.accuracy:.2%})")
        peak = max(max(row) for row in report.confusion_matrix) or 1
        for i in range(n):
            for j in range(n):
                count = report.confusion_matrix[i][j]
                ax.text(j, i, str(count), ha="center", va="center", fontsize=7,
                        color="white" if count > peak / 2 else "black")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def plot_learning_curve(history: Sequence[dict[str, Any]], path: str) -> str:
    """Write training loss and validation accuracy per epoch (rows of reported metrics) as a PNG."""
    plt = _pyplot()
    epochs = [row.get("epoch", i) + 1 for i, row in enumerate(history)]
    fig, loss_ax = plt.subplots(figsize=(7, 4.5))
    try:
        loss_ax.plot(epochs, [row.get("loss") for row in history], "o-", color="tab:red", label="train loss")
        if any("val_loss" in row for row in history):
            loss_ax.plot(epochs, [row.get("val_loss") for row in history], "s--", color="tab:orange",
                         label="validation loss")
        loss_ax.set_xlabel("epoch")
        loss_ax.set_ylabel("loss")
        acc_ax = loss_ax.twinx()
        acc_ax.plot(epochs, [row.get("val_accuracy") for row in history], "^-", color="tab:blue",
                    label="validation accuracy")
        acc_ax.set_ylabel("accuracy")
        acc_ax.set_ylim(0, 1)
        lines = loss_ax.get_lines() + acc_ax.get_lines()
        loss_ax.legend(lines, [line.get_label() for line in lines], loc="center right")
        loss_ax.set_title("Learning curve")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path
