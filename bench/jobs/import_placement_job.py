"""The tutorial's job on trainlib, torchvision imported inside the training function; run by bench/bench_import_placement.py.

``--driver-imports torchvision`` imports it in the driver first, as the tutorial's top-level import does: the
two variants differ only in whether the driver pays for that import before ``fit()`` starts Ray. Prints one
JSON line: seconds from the script's first line to rank 0's first step, and to the end of ``fit()``.
"""

from __future__ import annotations

import time

STARTED = time.time()

import argparse  # noqa: E402 - after the start time, as the benchmark times the imports
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402

STEPS = 3


def train_func(config: dict) -> None:
    from torch.utils.data import DataLoader
    from torchvision.datasets import FashionMNIST
    from torchvision.models import resnet18
    from torchvision.transforms import Compose, Normalize, ToTensor

    import trainlib
    import trainlib.torch

    model = resnet18(num_classes=10)
    model.conv1 = torch.nn.Conv2d(1, 64, kernel_size=(7, 7), stride=(2, 2), padding=(3, 3), bias=False)
    model = trainlib.torch.prepare_model(model)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = FashionMNIST(root=config["data_root"], train=True, download=False,
                        transform=Compose([ToTensor(), Normalize((0.28604,), (0.32025,))]))
    loader = trainlib.torch.prepare_data_loader(DataLoader(data, batch_size=128, shuffle=True))
    first_step = None
    for step, (images, labels) in enumerate(loader):
        if first_step is None:
            first_step = time.time()
        loss = criterion(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step + 1 == STEPS:
            break
    trainlib.report({"first_step": first_step})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True, help="torchvision's layout of FashionMNIST")
    parser.add_argument("--storage", required=True)
    parser.add_argument("--driver-imports", action="append", default=[], help="modules the driver imports first")
    args = parser.parse_args()
    for name in args.driver_imports:
        importlib.import_module(name)
    import trainlib
    import trainlib.torch

    result = trainlib.torch.TorchTrainer(
        train_func, train_loop_config={"data_root": args.data_root},
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(name=f"imports-{os.getpid()}", storage_path=args.storage),
    ).fit()
    print(json.dumps({"first_step_s": result.metrics["first_step"] - STARTED, "fit_end_s": time.time() - STARTED}))


if __name__ == "__main__":
    main()
