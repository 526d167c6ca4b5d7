"""Pictures of a training run: confusion matrix and learning curve as PNG files. Runs on the driver.

matplotlib with the Agg backend (no display needed).

Example::

    plot_confusion_matrix(report, "confusion_matrix.png")
    plot_learning_curve(training.history, "learning_curve.png")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tasks.domain.evaluation import EvaluationReport


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
                ax.text(
                    j,
                    i,
                    str(count),
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if count > peak / 2 else "black",
                )
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
            loss_ax.plot(
                epochs, [row.get("val_loss") for row in history], "s--", color="tab:orange", label="validation loss"
            )
        loss_ax.set_xlabel("epoch")
        loss_ax.set_ylabel("loss")
        acc_ax = loss_ax.twinx()
        acc_ax.plot(
            epochs, [row.get("val_accuracy") for row in history], "^-", color="tab:blue", label="validation accuracy"
        )
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
