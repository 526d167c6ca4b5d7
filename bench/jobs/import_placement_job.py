"""The benchmarks' job (bench/jobs/common.py) on trainlib, imported inside the training function.

Run by bench/bench_import_placement.py.

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

STEPS = 3


def train_func(config: dict) -> None:
    # The job's own module (torchvision at its top) is imported here, in the workers only.
    from common import BATCH_SIZE, build_dataset, build_model, train_steps
    from torch.utils.data import DataLoader

    import trainlib
    import trainlib.torch

    model = trainlib.torch.prepare_model(build_model())
    loader = DataLoader(build_dataset(config["data_root"]), batch_size=BATCH_SIZE, shuffle=True)
    loader = trainlib.torch.prepare_data_loader(loader)
    stamps = train_steps(model, loader, STEPS, loader.sampler.set_epoch)
    trainlib.report({"first_step": stamps["first_step_start"]})


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
        train_func,
        train_loop_config={"data_root": args.data_root},
        scaling_config=trainlib.ScalingConfig(num_workers=2),
        run_config=trainlib.RunConfig(name=f"imports-{os.getpid()}", storage_path=args.storage),
    ).fit()
    print(json.dumps({"first_step_s": result.metrics["first_step"] - STARTED, "fit_end_s": time.time() - STARTED}))


if __name__ == "__main__":
    main()
