"""A/B of the embedded Ray: trainlib's lean start and fast exit against plain ``ray.init``. Fresh processes.

    python bench/embedded_ray_ab.py 3 bench/results/embedded_ray_exit_ab.json   # 3 interleaved pairs

Each child imports torch, starts an embedded Ray ("new": trainlib's ensure_ray, which stops the
dashboard head and the autoscaler monitor and registers trainlib's exit hook; "old": plain
ray.init as trainlib did before), reports the RSS of Ray's processes, and ends. Measured: the
RSS, and the time from the script's end to the process's exit. The load average is recorded.
"""

import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHILD = r"""
import sys, time, os
import torch
mode = sys.argv[1]
if mode == "new":
    from trainlib._internal.startup.embedded_ray import ensure_ray, note_fit_ended
    ensure_ray(); note_fit_ended()
else:
    import ray; ray.init(address="local", include_dashboard=False, log_to_driver=True)
import ray, psutil
rss = sum(p.memory_info().rss for p in psutil.Process().children(recursive=True))
print(f"END {time.time()} {rss}", flush=True)
"""
res = {"old": [], "new": []}
for i in range(int(sys.argv[1])):
    for mode in ("old", "new") if i % 2 == 0 else ("new", "old"):
        load = os.getloadavg()[0]
        p = subprocess.run(
            [sys.executable, "-c", CHILD, mode], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": REPO}
        )
        t_exit = time.time()
        ends = [line for line in p.stdout.splitlines() if line.startswith("END")]
        if not ends:
            print(mode, "FAILED", p.stderr[-300:], flush=True)
            continue
        line = ends[0].split()
        res[mode].append(
            {"end_to_exit_s": t_exit - float(line[1]), "daemons_rss_mb": int(line[2]) / 2**20, "load": load}
        )
        print(mode, res[mode][-1], flush=True)
out = {
    m: {
        "median_end_to_exit_s": statistics.median(r["end_to_exit_s"] for r in v),
        "median_ray_processes_rss_mb": statistics.median(r["daemons_rss_mb"] for r in v),
        "runs": v,
    }
    for m, v in res.items()
}
json.dump(out, open(sys.argv[2], "w"), indent=1)
print(json.dumps({m: {k: v for k, v in o.items() if k != "runs"} for m, o in out.items()}))
