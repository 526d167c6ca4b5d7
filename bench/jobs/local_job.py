"""The benchmark job in a framework's local mode, ScalingConfig(num_workers=0): one process, the function in it.

    python bench/jobs/local_job.py {trainlib,raytrain} --steps 30 --data-root DIR --storage DIR --out DIR

The same job as trainlib_job.py / raytrain_job.py (imported first thing, so their start stamp is this
process's), with one torch thread as plain_job.py uses: local mode leaves the process's threads alone.
"""

import importlib
import sys

if __name__ == "__main__":
    framework = sys.argv.pop(1)
    job = importlib.import_module(f"{framework}_job")
    import torch

    torch.set_num_threads(1)
    job.main(num_workers=0)
