"""The benchmark job fed two ways: a torch DataLoader, or a Ray Data dataset. Driver + Ray workers.

    python bench/jobs/data_job.py --framework trainlib|raytrain --input dataloader|raydata \
        --steps 40 --data-root DIR --storage DIR --out DIR

The tutorial's job (bench/jobs/common.py: ResNet18, FashionMNIST, batch 128 per worker, 2 workers).
With ``--input raydata`` the training split is a Ray Data dataset (the raw uint8 images from
``ray.data.from_numpy``, normalised by a ``map_batches`` step as the tutorial's ToTensor+Normalize do),
and each worker reads ``get_dataset_shard("train").iter_torch_batches(batch_size=128)``.
"""

import time

T_START = time.time()

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import BATCH_SIZE, build_dataset, build_model, thread_info, train_steps, write_json  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

MEAN, STD = 0.28604, 0.32025


def normalise(batch: dict) -> dict:
    """The preprocessing step, run by Ray Data's tasks: uint8 rows -> normalised float images."""
    pixels = batch["data"][:, :784].astype(np.float32) / 255.0
    return {"image": ((pixels - MEAN) / STD).reshape(-1, 1, 28, 28), "label": batch["data"][:, 784].astype(np.int64)}


def ray_dataset(data_root: str):
    import ray.data

    raw = build_dataset(data_root)
    rows = np.concatenate(
        [raw.data.numpy().reshape(len(raw), 784), raw.targets.numpy()[:, None].astype(np.uint8)], axis=1
    )
    return ray.data.from_numpy(rows).map_batches(normalise, batch_size=1024)


class _ShardBatches:
    """Iterates a Ray Data shard as (images, labels), one pass per ``iter``: an epoch."""

    def __init__(self, get_shard):
        self._get_shard = get_shard

    def __iter__(self):
        for batch in self._get_shard().iter_torch_batches(batch_size=BATCH_SIZE, drop_last=True):
            yield batch["image"], batch["label"]


def train_func(config):
    t_enter = time.time()
    api, api_torch = _api(config["framework"])
    torch.manual_seed(0)
    model = api_torch.prepare_model(build_model())
    ctx = api.get_context()
    if config["input"] == "raydata":
        loader, set_epoch = _ShardBatches(lambda: api.get_dataset_shard("train")), None
    else:
        loader = api_torch.prepare_data_loader(
            DataLoader(build_dataset(config["data_root"]), batch_size=BATCH_SIZE, shuffle=True)
        )
        set_epoch = loader.sampler.set_epoch if ctx.get_world_size() > 1 else None
    stamps = train_steps(model, loader, config["steps"], set_epoch)
    api.report({"loss": stamps["final_loss"]})
    if ctx.get_world_rank() == 0:
        write_json(
            os.path.join(config["out"], "rank0.json"),
            {
                **stamps,
                "train_func_enter": t_enter,
                "report_start": time.time(),
                "report_end": time.time(),
                "world_size": ctx.get_world_size(),
                **thread_info(),
            },
        )


def _api(framework: str):
    if framework == "trainlib":
        import trainlib
        import trainlib.torch

        return trainlib, trainlib.torch
    import ray.train
    import ray.train.torch

    return ray.train, ray.train.torch


def main():
    parser = argparse.ArgumentParser()
    for name in ("--framework", "--input", "--data-root", "--storage", "--out"):
        parser.add_argument(name, required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    import ray

    # Both frameworks on the same embedded cluster settings (and never another cluster on this machine).
    # 4 logical CPUs on the 2-core machine: the 2 workers hold 2, and Ray Data's preprocessing tasks need
    # CPUs of their own; with num_cpus=2 they never get one and the Ray Data runs stall (seen 2026-12-01).
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    api, api_torch = _api(args.framework)
    config = {
        "framework": args.framework,
        "input": args.input,
        "steps": args.steps,
        "data_root": args.data_root,
        "out": args.out,
    }
    kwargs = {"datasets": {"train": ray_dataset(args.data_root)}} if args.input == "raydata" else {}
    t_imported = time.time()
    trainer = api_torch.TorchTrainer(
        train_func,
        train_loop_config=config,
        scaling_config=api.ScalingConfig(num_workers=2),
        run_config=api.RunConfig(name="bench", storage_path=args.storage),
        **kwargs,
    )
    t_fit = time.time()
    trainer.fit()
    write_json(
        os.path.join(args.out, "driver.json"),
        {
            "start": T_START,
            "imported": t_imported,
            "fit_start": t_fit,
            "fit_end": time.time(),
            "framework": f"{args.framework} + {args.input}",
        },
    )


if __name__ == "__main__":
    sys.exit(main())
