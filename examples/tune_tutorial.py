"""A Ray Tune sweep of 4 trials of Ray Train's getting-started tutorial job (FashionMNIST, ResNet18) on trainlib,
the Ray Train v2 way: a Tune function trainable builds and fits a trainer per trial, and Ray Tune's own
``TuneReportCallback`` reports each trial's metrics (and checkpoint path) back to Tune.

Run from the repository's root: ``PYTHONPATH=. python examples/tune_tutorial.py [--epochs 2] [--images 1024]
[--data ../shared/datasets/fashion-mnist]`` (the data folder holds the four official ``.gz`` files; without it
torchvision downloads them). Each trial's trainer needs 2 worker CPUs; the
trial itself reserves no CPU (it only drives its trainer), and ``max_concurrent_trials`` keeps the trials' workers
within the machine's CPUs, so no trial waits for CPUs that another trial's driver holds.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import ray
import ray.tune
import torch
from ray.tune.integration.ray_train import TuneReportCallback

import trainlib
from trainlib.torch import TorchTrainer, prepare_data_loader, prepare_model

WORKERS_PER_TRIAL = 2


def train_func(config: dict) -> None:
    """The tutorial's training function (runs on each worker), with the learning rate and epochs from the trial."""
    from torchvision.datasets import FashionMNIST
    from torchvision.models import resnet18
    from torchvision.transforms import Compose, Normalize, ToTensor

    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    model = prepare_model(model)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
    transform = Compose([ToTensor(), Normalize((0.28604,), (0.32025,))])
    data = FashionMNIST(root=config["data_root"], train=True, download=True, transform=transform)
    if config.get("images"):
        data = torch.utils.data.Subset(data, range(config["images"]))
    loader = prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=128, shuffle=True))
    for epoch in range(config["epochs"]):
        if trainlib.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        for images, labels in loader:
            loss = criterion(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with tempfile.TemporaryDirectory() as folder:
            if trainlib.get_context().get_world_rank() == 0:
                torch.save(model.module.state_dict(), os.path.join(folder, "model.pt"))
            trainlib.report(
                {"loss": loss.item(), "epoch": epoch}, checkpoint=trainlib.Checkpoint.from_directory(folder)
            )


def train_driver_fn(config: dict) -> None:
    """One Tune trial (a Tune actor): fit one trainlib trainer with the trial's hyperparameters."""
    trainer = TorchTrainer(
        train_func,
        train_loop_config=config["train_loop_config"],
        scaling_config=trainlib.ScalingConfig(num_workers=WORKERS_PER_TRIAL),
        run_config=trainlib.RunConfig(
            name=f"train-trial_id={ray.tune.get_context().get_trial_id()}",
            storage_path=config["storage_path"],
            callbacks=[TuneReportCallback()],
        ),
    )
    trainer.fit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--images", type=int, default=0, help="train on the first N images only (0: all 60,000)")
    parser.add_argument("--data", default=None, help="a folder with FashionMNIST's four .gz files (else: download)")
    parser.add_argument("--storage", default=os.path.expanduser("~/trainlib_results/tune_tutorial"))
    args = parser.parse_args()
    data_root = os.path.join(tempfile.gettempdir(), "data")
    if args.data:
        from tasks.domain.torchvision_layout import torchvision_layout

        torchvision_layout(args.data, data_root)
    # A new local Ray unless RAY_ADDRESS names a cluster (a bare ray.init() would join whatever cluster this
    # machine started last).
    ray.init(address=os.environ.get("RAY_ADDRESS", "local"))
    cpus = int(ray.cluster_resources()["CPU"])
    tuner = ray.tune.Tuner(
        # Tune refuses an empty resource request: a byte of memory reserves a place for the trial and no CPU.
        ray.tune.with_resources(train_driver_fn, {"cpu": 0, "memory": 1}),
        param_space={
            "storage_path": args.storage,
            "train_loop_config": {
                "lr": ray.tune.grid_search([1e-4, 3e-4, 1e-3, 3e-3]),
                "epochs": args.epochs,
                "images": args.images,
                "data_root": data_root,
            },
        },
        tune_config=ray.tune.TuneConfig(
            metric="loss", mode="min", max_concurrent_trials=max(1, cpus // WORKERS_PER_TRIAL)
        ),
    )
    results = tuner.fit()
    best = results.get_best_result()
    print(f"{len(results)} trials, {results.num_errors} failed; best lr {best.config['train_loop_config']['lr']}")
    print(f"best loss {best.metrics['loss']:.4f}, checkpoint {best.metrics.get('checkpoint_path')}")


if __name__ == "__main__":
    main()
