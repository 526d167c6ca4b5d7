"""The benchmark job in Ray Train's local mode, ScalingConfig(num_workers=0): one process, the function in it.

    python bench/jobs/raytrain_local_job.py --steps 30 --data-root DIR --storage DIR --out DIR

The same job as raytrain_job.py (its imports are this script's first lines, so its start stamp is this
process's), with one torch thread as plain_job.py uses: local mode leaves the process's threads alone.
"""

import torch

from raytrain_job import main

if __name__ == "__main__":
    torch.set_num_threads(1)
    main(num_workers=0)
