"""Hugging Face Transformers on trainlib: Ray Train's ``ray.train.huggingface.transformers``
(``RayTrainReportCallback``, ``prepare_trainer``). Worker actors (inside the training function); importing it imports
Transformers (``pip install trainlib[transformers]``).

``transformers.Trainer`` reads torchrun's variables (``LOCAL_RANK``, ``WORLD_SIZE``...), which trainlib's
``TorchTrainer`` sets on every worker, and finds the process group already formed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

try:
    import transformers.trainer
    from transformers.trainer_callback import TrainerCallback
except ModuleNotFoundError:
    raise ModuleNotFoundError(
        "Hugging Face Transformers isn't installed. To install it, run 'pip install trainlib[transformers]' "
        "(or 'pip install transformers')."
    ) from None
from torch.utils.data import DataLoader, IterableDataset

import trainlib

__all__ = ["RayTrainReportCallback", "prepare_trainer"]


class RayTrainReportCallback(TrainerCallback):
    """After each checkpoint save of ``transformers.Trainer``, reports the metrics logged so far (all of
    ``state.log_history`` merged, latest last) with a copy of the latest checkpoint, through ``trainlib.report``::

        checkpoint_00000*/   trainlib checkpoint
        └─ checkpoint/       Hugging Face Transformers checkpoint

    Align the logging, evaluation and save intervals so that the metrics are fresh at each save (e.g.
    ``eval_strategy == save_strategy == "epoch"``).
    """

    CHECKPOINT_NAME = "checkpoint"

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with tempfile.TemporaryDirectory() as tmpdir:
            metrics: dict[str, Any] = {}
            for log in state.log_history:
                metrics.update(log)
            source = transformers.trainer.get_last_checkpoint(args.output_dir)
            checkpoint = None
            if source is not None:
                shutil.copytree(source, os.path.join(tmpdir, self.CHECKPOINT_NAME))
                checkpoint = trainlib.Checkpoint.from_directory(tmpdir)
            trainlib.report(metrics=metrics, checkpoint=checkpoint)


class RayTorchIterableDataset(IterableDataset):
    """A Ray Data iterable (``shard.iter_torch_batches(...)``) as a torch ``IterableDataset`` of ready batches."""

    def __init__(self, data_iterable: Any) -> None:
        super().__init__()
        self.data_iterable = data_iterable

    def __iter__(self) -> Iterator:
        return iter(self.data_iterable)


def _is_ray_data_iterable(dataset: Any) -> bool:
    # What DataIterator.iter_torch_batches() returns; checked by name so that Ray Data is imported only by its users.
    cls = type(dataset)
    return cls.__name__ == "_IterableFromIterator" and cls.__module__.startswith("ray.data")


def _batches(dataset: Any) -> DataLoader:
    return DataLoader(RayTorchIterableDataset(dataset), batch_size=1, collate_fn=lambda x: x[0])


def prepare_trainer(trainer: transformers.trainer.Trainer) -> transformers.trainer.Trainer:
    """Let a ``transformers.Trainer`` take Ray Data iterables as ``train_dataset`` / ``eval_dataset``
    (``trainlib.get_dataset_shard("train").iter_torch_batches(batch_size=...)``), as in Ray Train; other datasets
    are used as the trainer uses them. Returns the same trainer (its class is extended in place)."""
    base: type = trainer.__class__

    class RayTransformersTrainer(base):
        """``transformers.Trainer`` reading Ray Data iterables batch by batch."""

        def get_train_dataloader(self) -> DataLoader:
            if _is_ray_data_iterable(self.train_dataset):
                return _batches(self.train_dataset)
            return super().get_train_dataloader()

        def get_eval_dataloader(self, eval_dataset: Any = None) -> DataLoader:
            if eval_dataset is None:
                eval_dataset = self.eval_dataset
            if (
                isinstance(eval_dataset, str)
                and isinstance(self.eval_dataset, dict)
                and _is_ray_data_iterable(self.eval_dataset[eval_dataset])
            ):
                return _batches(self.eval_dataset[eval_dataset])
            if _is_ray_data_iterable(eval_dataset):
                return _batches(eval_dataset)
            return super().get_eval_dataloader(eval_dataset)

    trainer.__class__ = RayTransformersTrainer
    return trainer
