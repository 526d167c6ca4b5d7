"""The benchmark job by hand for torchrun: gloo, DDP and a DistributedSampler. Runs in each torchrun rank.

    python -m torch.distributed.run --nproc_per_node=2 bench/jobs/torchrun_job.py --steps 30 \
        --data-root DIR --storage DIR --out DIR
"""

import time

T_START = time.time()

import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from common import (  # noqa: E402
    BATCH_SIZE,
    build_dataset,
    build_model,
    parse_job_args,
    thread_info,
    train_steps,
    write_json,
)
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

T_IMPORTED = time.time()


def main():
    args = parse_job_args()
    torch.set_num_threads(1)  # one per worker on this 2-core machine, as the Ray variants hold one CPU each
    t_enter = time.time()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DistributedDataParallel(build_model())
    dataset = build_dataset(args.data_root)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)
    stamps = train_steps(model, loader, args.steps, sampler.set_epoch)
    t_report = time.time()
    if rank == 0:
        os.makedirs(args.storage, exist_ok=True)
        torch.save(model.module.state_dict(), os.path.join(args.storage, "model.pt"))
    dist.barrier()  # the checkpoint exists before any rank exits, as a framework's report guarantees
    if rank == 0:
        write_json(
            os.path.join(args.out, "rank0.json"),
            {
                **stamps,
                "train_func_enter": t_enter,
                "report_start": t_report,
                "report_end": time.time(),
                "world_size": dist.get_world_size(),
                "start": T_START,
                "imported": T_IMPORTED,
                "checkpoint_bytes": os.path.getsize(os.path.join(args.storage, "model.pt")),
                "framework": f"torchrun (torch {torch.__version__})",
                **thread_info(),
            },
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
