"""Forming the process group when a rank is ready before rank 0: the store opened at rank 0's start vs before.

    python bench/bench_rendezvous.py                 # writes bench/results/rendezvous.{json,md}
    python bench/bench_rendezvous.py --repeats 1 --results-dir /tmp/r   # a quick try

What it answers (issue 14, trainlib/torch/_process_group.py): how long two ranks wait for their gloo
group beyond the moment the later of them is ready, when rank 1 is ready ``lead`` seconds before
rank 0. Two fresh processes per measurement (torch imported, then both wait for a common start
time); rank 1 calls ``init_process_group`` at the start time, rank 0 ``lead`` seconds later, in two modes:

- ``store opened by rank 0's init``: as trainlib did before (and as ``init_method="env://"`` does):
  nothing listens on the port until rank 0 calls it, so rank 1's store client backs off;
- ``store opened before``: rank 0 opened its store with ``open_store`` before either rank started (as
  trainlib's driver now has rank 0's actor do through ``open_rendezvous``) and passes it on.

In the training job, which rank finishes importing the user's modules first is chance.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from results_files import write_results

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {"store opened by rank 0's init": False, "store opened before": True}
LEADS = (0.0, 0.005, 0.05, 0.2, 0.5, 1.0)

RANK = """
import datetime, json, socket, sys, time
import torch, torch.distributed as dist
from trainlib.torch._process_group import init_process_group, open_store

rank, opened = int(sys.argv[1]), sys.argv[2] == "1"
timeout = datetime.timedelta(seconds=60)
store = None
if rank == 0 and opened:
    store = open_store("127.0.0.1", 2, timeout)
    port = store.port
else:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
print(port, flush=True)
port, start, lead = sys.stdin.readline().split()  # rank 0's port, the common start time, rank 0's delay
ready = float(start) + (float(lead) if rank == 0 else 0.0)
while time.time() < ready:
    time.sleep(0.0005)
init_process_group("gloo", "127.0.0.1", int(port), rank, 2, timeout, store=store)
print(json.dumps({"ready": ready, "formed": time.time()}), flush=True)
dist.destroy_process_group()
"""


def measure(opened: bool, lead: float) -> float:
    """Seconds from the later rank being ready to the group formed on both ranks."""
    env = {**os.environ, "PYTHONPATH": REPO}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), "1" if opened else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for rank in (0, 1)
    ]
    try:
        port = [int(p.stdout.readline()) for p in procs][0]  # both have imported torch by now
        start = time.time() + 0.3
        for p in procs:
            p.stdin.write(f"{port} {start} {lead}\n")
            p.stdin.flush()
        outs = [json.loads(p.stdout.readline()) for p in procs]
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return max(o["formed"] for o in outs) - max(o["ready"] for o in outs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="measurements per mode and lead (default 3)")
    parser.add_argument("--results-dir", default=os.path.join(REPO, "bench", "results"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    runs = []
    for repeat in range(args.repeats):
        for lead in LEADS:
            modes = list(MODES.items())
            for name, opened in modes if repeat % 2 == 0 else modes[::-1]:
                wait = measure(opened, lead)
                runs.append({"mode": name, "lead_s": lead, "repeat": repeat, "wait_s": wait})
                print(f"[{repeat + 1}/{args.repeats}] rank 1 {lead:.3f} s early, {name}: {wait:.3f} s", flush=True)
    medians = {
        name: {
            str(lead): statistics.median(r["wait_s"] for r in runs if r["mode"] == name and r["lead_s"] == lead)
            for lead in LEADS
        }
        for name in MODES
    }
    lines = [
        "# Forming the process group with a rank ready early",
        "",
        f"Reproduce: `python bench/bench_rendezvous.py --repeats {args.repeats}`; load average before "
        f"{load_before[0]:.1f}, after {os.getloadavg()[0]:.1f}.",
        "",
        "Seconds from the later rank being ready to the gloo group formed on both ranks (2 ranks, 127.0.0.1), "
        f"median of {args.repeats}; rank 1 is ready first by the lead:",
        "",
        "| rank 1 early by | " + " | ".join(MODES) + " |",
        "|---|" + "---|" * len(MODES),
    ]
    for lead in LEADS:
        lines.append(f"| {lead:.3f} s | " + " | ".join(f"{medians[name][str(lead)]:.3f}" for name in MODES) + " |")
    write_results(
        args.results_dir,
        "rendezvous",
        {"load_average_before": load_before, "runs": runs, "median_wait_s": medians},
        lines,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
