"""The benchmark job as plain single-process PyTorch: no DDP, batches of 128. One process.

python bench/jobs/plain_job.py --steps 30 --data-root DIR --storage DIR --out DIR
"""

import time

T_START = time.time()

import os  # noqa: E402

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


def main():
    args = parse_job_args()
    torch.set_num_threads(1)  # the same one thread as each distributed worker
    t_enter = time.time()
    torch.manual_seed(0)
    model = build_model()
    loader = DataLoader(build_dataset(args.data_root), batch_size=BATCH_SIZE, shuffle=True)
    stamps = train_steps(model, loader, args.steps, None)
    t_report = time.time()
    os.makedirs(args.storage, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(args.storage, "model.pt"))
    write_json(
        os.path.join(args.out, "rank0.json"),
        {
            **stamps,
            "train_func_enter": t_enter,
            "report_start": t_report,
            "report_end": time.time(),
            "world_size": 1,
            "start": T_START,
            "imported": T_IMPORTED,
            "checkpoint_bytes": os.path.getsize(os.path.join(args.storage, "model.pt")),
            "framework": f"plain PyTorch (torch {torch.__version__})",
            **thread_info(),
        },
    )


if __name__ == "__main__":
    main()
