"""Where a DDP step's CPU goes, by function: `perf` samples of rank 0's training thread and gloo's threads.

    python bench/bench_ddp_functions.py             # writes bench/results/ddp_functions.{json,md}
    python bench/bench_ddp_functions.py --rounds 1 --steps 10 --results-dir /tmp/f   # a quick try

What it answers (issue 14): of what the 400-step job loses to DDP on two cores, how much is moving the
gradients' bytes, how much the kernel's loopback TCP path, how much new work in the training thread
(DDP's averaging) and how much the same code running slower beside gloo's threads.

Each round runs bench_ddp.py's step (the tutorial's ResNet18, random batches, Adam, 1 thread per
process, trainlib's malloc settings) in two fresh process pairs, one right after the other: two
processes that share a gloo process group but whose model is not wrapped in DDP, then two DDP ranks
(``gradient_as_bucket_view``, trainlib's default). In rank 0, Linux ``perf`` (``perf record -e
cpu-clock``) samples the training thread and gloo's threads during the measured steps only (attached
after the warm-up, started and stopped through perf's control FIFO). Per step, each function's samples
are put in a few groups. Medians over rounds; the DDP minus no-DDP difference is taken within each round.

Needs ``perf`` (Debian: ``apt-get install linux-perf``) and the right to sample another thread of the
same user (root, or ``kernel.perf_event_paranoid`` <= 1).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import bench_ddp
from bench_overhead import RESULTS
from results_files import write_results

HZ = 2000  # samples a second per thread: ~700 a step of ~0.35 s
# Groups of functions, first match wins: (group, thread kind, pattern on "[k] symbol" / "[.] symbol").
GROUPS: tuple[tuple[str, str, str], ...] = (
    ("copies between socket buffers and memory", "gloo", r"copy_(to|from)_iter|copy_user|memcpy|memmove"),
    ("the sum (gloo::sum)", "gloo", r"gloo::sum"),
    ("the kernel's TCP, epoll, wake-ups, softirqs", "gloo", r"^\[k\]"),
    ("gloo's loop and glibc, user space", "gloo", r""),
    ("convolutions (oneDNN and its JIT code)", "train", r"dnnl|^\[\.\] 0x[0-9a-f]+$"),
    ("mul kernels (DDP's averaging; Adam's mul_)", "train", r"\bmul_kernel\b"),
    (
        "Adam's other elementwise kernels",
        "train",
        r"\b(addcdiv_cpu_kernel|div_true_kernel|lerp_scalar_kernel|"
        r"addcmul_cpu_kernel|add_kernel)\b",
    ),
    ("Adam's sqrt (MKL)", "train", r"[sS]qrt"),
    ("BatchNorm", "train", r"batch_norm"),
    ("the kernel", "train", r"^\[k\]"),
    ("the rest", "train", r""),
)


class ThreadSampler:
    """``perf record`` attached to some threads of this process, sampling only between enable() and finish()."""

    def __init__(self, tids: list[int], out: str, hz: int = HZ):
        self._dir = tempfile.mkdtemp(prefix="perf-ctl-")
        ctl, ack = os.path.join(self._dir, "ctl"), os.path.join(self._dir, "ack")
        os.mkfifo(ctl)
        os.mkfifo(ack)
        self._proc = subprocess.Popen(
            [
                "perf",
                "record",
                "-q",
                "-e",
                "cpu-clock",
                "-F",
                str(hz),
                "-D",
                "-1",
                "--control",
                f"fifo:{ctl},{ack}",
                "-o",
                out,
                "-t",
                ",".join(map(str, tids)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while True:  # perf opens the FIFO once attached; a writer's open without a reader fails (ENXIO)
            try:
                self._ctl = os.open(ctl, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"perf record did not start: {self._proc.stderr.read().decode()[-500:]}"
                    ) from None
                time.sleep(0.05)
        self._ack = open(ack)

    def _send(self, command: str) -> None:
        os.write(self._ctl, f"{command}\n".encode())
        self._ack.readline()  # perf's "ack": the events are on (off) from here

    def enable(self) -> None:
        self._send("enable")

    def finish(self) -> None:
        self._send("disable")
        self._proc.send_signal(signal.SIGINT)
        self._proc.wait(timeout=60)
        os.close(self._ctl)
        self._ack.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def _rank(rank: int, port: int, ddp: bool, steps: int, warmup: int, out: str, perf_out: str) -> None:
    bench_ddp._set_malloc("trainlib")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = bench_ddp._model()
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    sampler = None
    if rank == 0:  # the training thread and gloo's, which exist once the process group does
        gloo = [tid for tid, name in bench_ddp._threads().items() if "gloo" in name]
        sampler = ThreadSampler([os.getpid(), *gloo], perf_out)
    phases = bench_ddp._train(model, steps, warmup, at_warmup=sampler.enable if sampler else None)
    if sampler:
        sampler.finish()
        with open(out, "w") as f:
            json.dump(phases, f)
    dist.destroy_process_group()


def run_pair(ddp: bool, steps: int, warmup: int, out: str, perf_out: str) -> dict[str, Any]:
    bench_ddp.spawn_pair(_rank, ddp, steps, warmup, out, perf_out, what=f", ddp={ddp}")
    with open(out) as f:
        return json.load(f)


def grouped_ms(perf_data: str, steps: int, hz: int = HZ) -> dict[str, float]:
    """ms a measured step per group of GROUPS, from ``perf report`` on ``perf_data``."""
    report = subprocess.run(
        [
            "perf",
            "report",
            "-i",
            perf_data,
            "--no-children",
            "--sort",
            "comm,sym",
            "-n",
            "--stdio",
            "-g",
            "none",
            "-t",
            ";",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    ms = {name: 0.0 for name, _, _ in GROUPS}
    for line in report.splitlines():
        fields = [f.strip() for f in line.split(";")]
        if line.startswith("#") or len(fields) != 4 or not fields[1].isdigit():
            continue
        samples, comm, symbol = int(fields[1]), fields[2], fields[3]
        kind = "gloo" if "gloo" in comm else "train"
        name = next(n for n, k, pattern in GROUPS if k == kind and re.search(pattern, symbol))
        ms[name] += samples / hz / steps * 1000
    return ms


def markdown(report: dict[str, Any]) -> str:
    s, rounds = report["settings"], report["rounds"]

    def cell(values: list[float]) -> str:
        return f"{', '.join(f'{v:.1f}' for v in values)} | **{statistics.median(values):.1f}**"

    lines = [
        f"Rank 0 of 2 ranks x 1 thread on {os.cpu_count()} CPUs, bench_ddp.py's step (batch {bench_ddp.BATCH}, "
        f"trainlib's malloc settings); {s['steps']} steps, the first {s['warmup']} not sampled; {len(rounds)} "
        f"round(s), each a pair without DDP then a DDP pair; `perf record -e cpu-clock -F {s['hz']}`. Load "
        f"average before/after: {'/'.join(f'{x:.2f}' for x in report['load_average_before'])} / "
        f"{'/'.join(f'{x:.2f}' for x in report['load_average_after'])}.",
        "",
        "| ms a step | no DDP, by round | median | DDP, by round | median |",
        "|---|---|---|---|---|",
    ]
    for label, key in (
        ("step (median of the steps)", "step_s"),
        ("training thread's CPU (/proc)", "cpu_train_s"),
        ("gloo's threads' CPU (/proc)", "cpu_gloo_s"),
    ):
        lines.append(
            f"| {label} | "
            + " | ".join(cell([r[side][key] * 1000 for r in rounds]) for side in ("plain", "ddp"))
            + " |"
        )
    lines += [
        "",
        "gloo's threads in the DDP pair, by function (perf):",
        "",
        "| group | ms a step, by round | median |",
        "|---|---|---|",
    ]
    gloo = [name for name, kind, _ in GROUPS if kind == "gloo"]
    for name in gloo:
        lines.append(f"| {name} | {cell([r['ddp']['functions_ms'][name] for r in rounds])} |")
    lines.append(f"| all | {cell([sum(r['ddp']['functions_ms'][n] for n in gloo) for r in rounds])} |")
    lines += [
        "",
        "The training thread, ms a step more in the DDP pair than in the pair just before it, by function "
        "(perf; the no-DDP pair's own ms in the last column):",
        "",
        "| group | by round | median | no DDP (median) |",
        "|---|---|---|---|",
    ]
    train = [name for name, kind, _ in GROUPS if kind == "train"]
    for name in [*train, "all"]:
        names = train if name == "all" else [name]
        diffs = [sum(r["ddp"]["functions_ms"][n] - r["plain"]["functions_ms"][n] for n in names) for r in rounds]
        base = statistics.median(sum(r["plain"]["functions_ms"][n] for n in names) for r in rounds)
        lines.append(f"| {name} | {cell(diffs)} | {base:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--results-dir", default=RESULTS)
    args = parser.parse_args(argv)
    if args.steps <= args.warmup + 1:
        parser.error(f"--steps={args.steps} must exceed --warmup={args.warmup} by 2 or more")
    if shutil.which("perf") is None:
        parser.error("needs Linux perf on PATH (Debian: apt-get install linux-perf)")
    measured = args.steps - args.warmup
    load_before = os.getloadavg()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        out, perf_data = os.path.join(tmp, "rank0.json"), os.path.join(tmp, "perf.data")
        for r in range(args.rounds):
            row = {}
            for side, ddp in (("plain", False), ("ddp", True)):
                row[side] = run_pair(ddp, args.steps, args.warmup, out, perf_data)
                row[side]["functions_ms"] = grouped_ms(perf_data, measured)
                print(
                    f"[round {r + 1}] {'DDP' if ddp else 'no DDP'}: {row[side]['step_s'] * 1000:.0f} ms/step, "
                    f"sampled {sum(row[side]['functions_ms'].values()):.0f} ms/step",
                    flush=True,
                )
            rounds.append(row)
    report = {
        "written_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "settings": {"steps": args.steps, "warmup": args.warmup, "hz": HZ, "batch": bench_ddp.BATCH},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "rounds": rounds,
    }
    header = ["# Where a DDP step's CPU goes, by function", "", "Reproduce: `python bench/bench_ddp_functions.py`.", ""]
    write_results(args.results_dir, "ddp_functions", report, header + markdown(report).splitlines())
    return 0


if __name__ == "__main__":
    sys.exit(main())
