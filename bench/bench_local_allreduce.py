"""DDP's gradient allreduce on 2 CPU ranks: gloo's against trainlib's shared-memory one, interleaved in the same processes.

    python bench/bench_local_allreduce.py                    # writes bench/results/local_allreduce.{json,md}
    python bench/bench_local_allreduce.py --pairs 1 --blocks 8 --results-dir /tmp/la   # a quick try

This machine's speed drifts by 20-40% within minutes (a shared VM), more than the difference
measured here, so separate process pairs per configuration (bench_ddp.py) cannot show it. Each
pair of ranks here trains the tutorial's ResNet18 (random 1x28x28 batches of 128, Adam, 1 thread
per rank, trainlib's malloc settings, as a TorchTrainer worker) and switches how its DDP sums the
gradients every few steps, in turn:

- ``gloo``: ``dist.all_reduce`` through gloo's TCP loopback, as DDP's default hook;
- ``shared memory, N MB chunks``: ``trainlib/torch/_local_allreduce.py`` in the backward
  pass's thread (what ``prepare_model`` installs, with 1 MB chunks);
- ``shared memory in a thread``: the same, run by a thread of its own so that backward goes on
  meanwhile (tried, not used).

The first step of each block is skipped (the previous mode's last bucket may still be in flight);
medians over the rest, then over the pairs. The standalone time of one allreduce of all gradients
(43 MB) is measured after the steps, for gloo and for shared memory.
"""

from __future__ import annotations

import argparse
import datetime
import os
import queue
import statistics
import sys
import threading
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from bench_ddp import BATCH, _free_port, _model  # noqa: E402
from results_files import write_results  # noqa: E402

MODES = ("gloo", "shared memory, 1 MB chunks", "shared memory, 4 MB chunks", "shared memory, 16 MB chunks",
         "shared memory in a thread, 1 MB chunks")
CHUNKS = {"1 MB": 1 << 20, "4 MB": 4 << 20, "16 MB": 16 << 20}
STEPS_PER_BLOCK = 4


class _Threaded:
    """A LocalAllreduce run by a thread of its own: the hook returns at once, the future completes later."""

    def __init__(self, allreduce: Any):
        self.allreduce = allreduce
        self.pending: queue.Queue = queue.Queue()
        threading.Thread(target=self._serve, daemon=True).start()

    def submit(self, flat: Any) -> Any:
        import torch

        done = torch.futures.Future()
        self.pending.put((flat, done))
        return done

    def _serve(self) -> None:
        while True:
            flat, done = self.pending.get()
            done.set_result(self.allreduce.allreduce_(flat))


def _rank(rank: int, port: int, blocks: int, out: str) -> None:
    import json

    import torch
    import torch.distributed as dist

    from trainlib._internal.util.allocator import keep_step_allocations
    from trainlib.torch._local_allreduce import LocalAllreduce

    keep_step_allocations()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = torch.nn.parallel.DistributedDataParallel(_model(), gradient_as_bucket_view=True)
    shared = {size: LocalAllreduce.create(chunk_bytes=chunk) for size, chunk in CHUNKS.items()}
    threaded = _Threaded(LocalAllreduce.create(chunk_bytes=CHUNKS["1 MB"]))
    mode = [MODES[0]]

    def hook(state, bucket):
        buffer = bucket.buffer().div_(2)
        if mode[0] == "gloo":
            return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])
        if mode[0].startswith("shared memory in a thread"):
            return threaded.submit(buffer)
        done = torch.futures.Future()
        done.set_result(shared[mode[0].split(", ")[1].removesuffix(" chunks")].allreduce_(buffer))
        return done

    model.register_comm_hook(None, hook)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = torch.nn.CrossEntropyLoss()
    images, labels = torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for block in range(blocks * len(MODES) + 1):  # one warm-up block
        mode[0] = MODES[block % len(MODES)]
        for i in range(STEPS_PER_BLOCK):
            t = time.perf_counter()
            loss = criterion(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if block > 0 and i > 0:
                times[mode[0]].append(time.perf_counter() - t)
    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    standalone: dict[str, list[float]] = {"gloo": [], "shared memory": []}
    for _ in range(5):
        for name in standalone:
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(grads) if name == "gloo" else shared["1 MB"].allreduce_(grads)
            standalone[name].append(time.perf_counter() - t)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"step_s": {m: statistics.median(v) for m, v in times.items()},
                       "allreduce_s": {m: statistics.median(v) for m, v in standalone.items()},
                       "grad_mb": grads.numel() * 4 / 2**20}, f)
    dist.destroy_process_group()


def run_pair(blocks: int, out: str) -> dict[str, Any]:
    import json

    import torch.multiprocessing as mp

    port = _free_port()
    procs = [mp.get_context("spawn").Process(target=_rank, args=(r, port, blocks, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=900)
        if p.exitcode != 0:
            raise RuntimeError(f"a rank failed (exit code {p.exitcode})")
    with open(out) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="process pairs, one after another (default 3)")
    parser.add_argument("--blocks", type=int, default=10, help="blocks of 4 steps per mode and pair (default 10)")
    parser.add_argument("--results-dir", default=os.path.join(HERE, "results"))
    args = parser.parse_args(argv)
    os.makedirs(args.results_dir, exist_ok=True)
    tmp = os.path.join(args.results_dir, ".local_allreduce_rank0.json")
    load_before = os.getloadavg()
    pairs = []
    for i in range(args.pairs):
        pairs.append(run_pair(args.blocks, tmp))
        print(f"[pair {i + 1}] " + ", ".join(f"{m}: {s * 1000:.0f} ms" for m, s in pairs[-1]["step_s"].items()),
              flush=True)
    os.remove(tmp)
    step = {m: statistics.median(p["step_s"][m] for p in pairs) for m in MODES}
    standalone = {m: statistics.median(p["allreduce_s"][m] for p in pairs) for m in pairs[0]["allreduce_s"]}
    payload = {
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {"pairs": args.pairs, "blocks": args.blocks, "steps_per_block": STEPS_PER_BLOCK, "batch": BATCH},
        "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "step_s": step, "allreduce_s": standalone, "grad_mb": pairs[0]["grad_mb"], "pairs": pairs,
    }
    lines = [
        "# DDP's gradient allreduce on CPU: gloo against shared memory",
        "",
        "Reproduce: `python bench/bench_local_allreduce.py`.",
        "",
        f"2 DDP ranks x 1 thread on {os.cpu_count()} CPUs, tutorial ResNet18, batch {BATCH} per rank; the allreduce "
        f"switched every {STEPS_PER_BLOCK} steps in the same processes, {args.blocks} blocks per mode, "
        f"{args.pairs} pair(s); medians. Load average before/after: "
        f"{'/'.join(f'{x:.2f}' for x in load_before)} / {'/'.join(f'{x:.2f}' for x in os.getloadavg())}.",
        "",
        "| allreduce | ms/step | against gloo | per pair, ms/step |",
        "|---|---|---|---|",
    ]
    for m in MODES:
        per_pair = ", ".join(f"{p['step_s'][m] * 1000:.0f}" for p in pairs)
        lines.append(f"| {m} | {step[m] * 1000:.0f} | {step[m] / step['gloo']:.3f} | {per_pair} |")
    lines += ["", f"One allreduce of all {payload['grad_mb']:.0f} MB of gradients, alone: gloo "
              f"{standalone['gloo'] * 1000:.1f} ms, shared memory (1 MB chunks) {standalone['shared memory'] * 1000:.1f} ms."]
    write_results(args.results_dir, "local_allreduce", payload, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
