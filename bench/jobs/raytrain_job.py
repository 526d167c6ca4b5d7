"""The benchmark job on Ray Train: 2 workers, as a user runs it (fit() starts Ray). Driver + Ray workers.

python bench/jobs/raytrain_job.py --steps 30 --data-root DIR --storage DIR --out DIR
"""

import time

T_START = time.time()

import os  # noqa: E402
import tempfile  # noqa: E402

import ray  # noqa: E402
import ray.train  # noqa: E402
import ray.train.torch  # noqa: E402
import torch  # noqa: E402
from common import (  # noqa: E402
    BATCH_SIZE,
    build_dataset,
    build_model,
    parse_job_args,
    thread_info,
    train_steps,
    write_json,
)
from torch.utils.data import DataLoader  # noqa: E402

T_IMPORTED = time.time()


def train_func(config):
    t_enter = time.time()
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(build_model())
    loader = DataLoader(build_dataset(config["data_root"]), batch_size=BATCH_SIZE, shuffle=True)
    loader = ray.train.torch.prepare_data_loader(loader)
    ctx = ray.train.get_context()
    set_epoch = loader.sampler.set_epoch if ctx.get_world_size() > 1 else None
    stamps = train_steps(model, loader, config["steps"], set_epoch)
    t_report = time.time()
    metrics = {"loss": stamps["final_loss"], "steps": config["steps"]}
    if ctx.get_world_rank() == 0:
        with tempfile.TemporaryDirectory() as folder:
            # Local mode (num_workers=0) gives the model unwrapped.
            torch.save(getattr(model, "module", model).state_dict(), os.path.join(folder, "model.pt"))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))
    else:
        ray.train.report(metrics)
    if ctx.get_world_rank() == 0:
        write_json(
            os.path.join(config["out"], "rank0.json"),
            {
                **stamps,
                "train_func_enter": t_enter,
                "report_start": t_report,
                "report_end": time.time(),
                "world_size": ctx.get_world_size(),
                **thread_info(),
            },
        )


def train_version() -> str:
    try:
        from ray.train.v2._internal.constants import is_v2_enabled
    except ImportError:
        return "v1"
    return "v2" if is_v2_enabled() else "v1"


def main(num_workers: int = 2):
    args = parse_job_args()
    t_fit = time.time()
    trainer = ray.train.torch.TorchTrainer(
        train_func,
        train_loop_config={"steps": args.steps, "data_root": args.data_root, "out": args.out},
        scaling_config=ray.train.ScalingConfig(num_workers=num_workers, use_gpu=False),
        run_config=ray.train.RunConfig(name="bench", storage_path=args.storage),
    )
    result = trainer.fit()
    t_fit_end = time.time()
    try:
        with result.checkpoint.as_directory() as folder:
            size = os.path.getsize(os.path.join(folder, "model.pt"))
    except OSError:  # local mode returns the folder the function reported: a TemporaryDirectory, gone by now
        size = None
    write_json(
        os.path.join(args.out, "driver.json"),
        {
            "start": T_START,
            "imported": T_IMPORTED,
            "fit_start": t_fit,
            "fit_end": t_fit_end,
            "checkpoint_bytes": size,
            "framework": f"Ray Train {train_version()} (ray {ray.__version__})"
            + (" local mode" if num_workers == 0 else ""),
        },
    )


if __name__ == "__main__":
    main()
