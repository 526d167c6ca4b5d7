"""PyTorch Lightning on trainlib: Ray Train's ``ray.train.lightning`` (``RayDDPStrategy``, ``RayFSDPStrategy``,
``RayDeepSpeedStrategy``, ``RayLightningEnvironment``, ``RayTrainReportCallback``, ``prepare_trainer``). Worker actors
(inside the training function); importing it imports Lightning (``pip install trainlib[lightning]``).

trainlib's ``TorchTrainer`` has formed the process group before the training function runs, and has set torchrun's
variables (``MASTER_ADDR``, ``LOCAL_RANK``, ...): Lightning's strategies find the group formed and join nothing again.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

try:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.environments import LightningEnvironment
except ModuleNotFoundError:
    try:
        import pytorch_lightning as pl
        from pytorch_lightning.plugins.environments import LightningEnvironment
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "PyTorch Lightning isn't installed. To install it, run 'pip install trainlib[lightning]' "
            "(or 'pip install lightning')."
        ) from None

import torch

import trainlib
from trainlib.reporting import CheckpointUploadMode
from trainlib.torch import get_device

__all__ = [
    "RayDDPStrategy",
    "RayDeepSpeedStrategy",
    "RayFSDPStrategy",
    "RayLightningEnvironment",
    "RayTrainReportCallback",
    "prepare_trainer",
]


class _OnTrainlibDevice:
    """What Ray Train's strategies change in Lightning's: the device trainlib chose, the ranks of the group."""

    @property
    def root_device(self) -> torch.device:
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}


class RayDDPStrategy(_OnTrainlibDevice, pl.strategies.DDPStrategy):
    """Lightning's ``DDPStrategy`` on trainlib's process group and device (the backend and timeout come from
    ``trainlib.torch.TorchConfig``)."""


class RayFSDPStrategy(_OnTrainlibDevice, pl.strategies.FSDPStrategy):
    """Lightning's ``FSDPStrategy`` on trainlib's process group and device."""


class RayDeepSpeedStrategy(_OnTrainlibDevice, pl.strategies.DeepSpeedStrategy):
    """Lightning's ``DeepSpeedStrategy`` on trainlib's process group and device (needs ``pip install deepspeed``)."""


class RayLightningEnvironment(LightningEnvironment):
    """Lightning's cluster environment read from trainlib's context: world size and ranks of this worker."""

    def world_size(self) -> int:
        return trainlib.get_context().get_world_size()

    def global_rank(self) -> int:
        return trainlib.get_context().get_world_rank()

    def local_rank(self) -> int:
        return trainlib.get_context().get_local_rank()

    def node_rank(self) -> int:
        return trainlib.get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        pass  # world_size() reads trainlib's context

    def set_global_rank(self, rank: int) -> None:
        pass  # global_rank() reads trainlib's context

    def teardown(self) -> None:
        pass


_STRATEGIES = (RayDDPStrategy, RayFSDPStrategy, RayDeepSpeedStrategy)


def prepare_trainer(trainer: pl.Trainer) -> pl.Trainer:
    """Check that a Lightning ``Trainer`` runs on trainlib: one of this module's strategies, and
    ``RayLightningEnvironment`` as its cluster environment; returns the trainer.

    Raises:
        RuntimeError: another strategy or cluster environment, as in Ray Train.
    """
    if not isinstance(trainer.strategy, _STRATEGIES):
        raise RuntimeError(
            f"Invalid strategy class: {type(trainer.strategy)}. To use PyTorch Lightning with trainlib, the "
            f"strategy object should be one of {[cls.__name__ for cls in _STRATEGIES]} class or its subclass: "
            "pl.Trainer(strategy=trainlib.lightning.RayDDPStrategy(), ...)."
        )
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if environment is not None and not isinstance(environment, RayLightningEnvironment):
        raise RuntimeError(
            "Invalid cluster environment plugin. The expected class is `trainlib.lightning.RayLightningEnvironment` "
            f"but got {type(environment)}: pl.Trainer(plugins=[trainlib.lightning.RayLightningEnvironment()], ...)."
        )
    return trainer


class RayTrainReportCallback(pl.callbacks.Callback):
    """Reports ``trainer.callback_metrics`` (with ``epoch`` and ``step``) and a checkpoint at every train epoch's
    end through ``trainlib.report``, from every rank. The checkpoint folder holds Lightning's checkpoint file::

        checkpoint_00000*/      trainlib checkpoint
        └─ checkpoint.ckpt      PyTorch Lightning checkpoint

    Args:
        checkpoint_upload_mode: as ``trainlib.report``'s (default ``CheckpointUploadMode.SYNC``).
        validation: Ray Train's asynchronous validation, which trainlib does not have: only ``False``.
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(self, checkpoint_upload_mode: CheckpointUploadMode | None = None, validation: Any = False) -> None:
        super().__init__()
        if validation:
            raise ValueError(
                f"RayTrainReportCallback(validation={validation!r}): trainlib has no asynchronous checkpoint "
                "validation. Validate in the training loop (a Lightning validation step) and its metrics are "
                "reported with the checkpoint."
            )
        self.checkpoint_upload_mode = checkpoint_upload_mode or CheckpointUploadMode.SYNC
        context = trainlib.get_context()
        # One folder per run and rank on this machine (Ray Train's layout, with the process instead of Ray's job).
        self.tmpdir_prefix = os.path.join(
            tempfile.gettempdir(),
            f"lightning_checkpoints-pid={os.getpid()}-name={context.get_experiment_name()}"
            f"-world_rank={context.get_world_rank()}",
        )
        if os.path.isdir(self.tmpdir_prefix):
            shutil.rmtree(self.tmpdir_prefix)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        tmpdir = os.path.join(self.tmpdir_prefix, str(trainer.current_epoch))
        os.makedirs(tmpdir, exist_ok=True)
        metrics = {k: v.item() for k, v in trainer.callback_metrics.items()}
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        trainer.save_checkpoint(os.path.join(tmpdir, self.CHECKPOINT_NAME), weights_only=False)
        trainlib.report(
            metrics=metrics,
            checkpoint=trainlib.Checkpoint.from_directory(tmpdir),
            checkpoint_upload_mode=self.checkpoint_upload_mode,
        )
        trainer.strategy.barrier()  # every rank has reported (and copied its files) before any goes on
        if self.checkpoint_upload_mode.default_delete_local_checkpoint_after_upload():
            return  # report() deletes the folder after its background upload
        shutil.rmtree(tmpdir)
