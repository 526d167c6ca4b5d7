"""Where a pipeline run's seconds beyond ``fit()`` go: the flow's steps, Ray's worker processes, and the CPU of each.

    python bench/trace_pipeline.py [--limit 1024] [--runs 2] [--mirror ../shared/datasets/fashion-mnist]

Runs the pipeline as ``bench_pipeline.py`` does (a fresh home, its Prefect server, a local Ray), ``--runs`` times
in one home: from the second run on, a scheduled retrain's case (a champion exists, the MLflow store's tables
too). Each run trains 1 epoch on ``--limit`` images (the overhead does not depend on it). For each run, in
seconds from the flow's call:

* the flow process: the flow's body begins, the task runner starts and stops Ray, each step's window;
* Ray's worker processes (from Ray's core-worker logs): when each was created, what it ran (its process titles,
  sampled), and when an actor was created on it; a worker created after the train step began was started on
  demand, not prestarted;
* every process's CPU seconds during the download and the evaluate steps (sampled every 0.25 s).

Writes bench/results/pipeline_trace.{json,md} (``--tag`` names other files).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import os
import platform
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from bench_pipeline import start_fresh_home
from overhead_jobs import DATA
from results_files import RESULTS, plain_name, write_results

SAMPLE_S = 0.25
RAY_LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
WORKER_LOG = re.compile(r"python-core-worker-[0-9a-f]+_(\d+)\.log$")


class ProcessSampler:
    """Every process's title and cumulative CPU seconds, every ``SAMPLE_S`` seconds, in a thread."""

    def __init__(self) -> None:
        import psutil

        self.psutil = psutil
        self.samples: list[tuple[float, dict[int, float]]] = []
        self.titles: dict[int, set[str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> ProcessSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            cpu: dict[int, float] = {}
            for process in self.psutil.process_iter(["cmdline"]):
                try:
                    times = process.cpu_times()
                except self.psutil.Error:
                    continue
                cpu[process.pid] = times.user + times.system
                title = " ".join(process.info["cmdline"] or []).strip()
                seen = self.titles.setdefault(process.pid, set())
                if title.startswith("ray::") and not title.startswith("ray::IDLE"):  # a Ray worker: what it runs
                    seen.difference_update([t for t in seen if not t.startswith("ray::")])  # its start, or "nothing"
                    seen.add(title.split(".")[0].split()[0])
                elif title and not seen:  # any other process: its command line
                    seen.add("nothing" if title.startswith("ray::IDLE") else title[:60])
            self.samples.append((time.time(), cpu))

    def cpu_between(self, start: float, end: float, top: int = 5) -> list[dict[str, Any]]:
        """The ``top`` processes by CPU seconds used between wall times ``start`` and ``end``."""
        before = min(self.samples, key=lambda s: abs(s[0] - start))[1]
        after = min(self.samples, key=lambda s: abs(s[0] - end))[1]
        used = {pid: seconds - before.get(pid, 0.0) for pid, seconds in after.items()}
        ranked = sorted(((s, pid) for pid, s in used.items() if s >= 0.05), reverse=True)[:top]
        return [{"pid": pid, "cpu_s": round(s, 2), "title": self.title(pid)} for s, pid in ranked]

    def title(self, pid: int) -> str:
        """The process's command line, or for a Ray worker (which renames itself ``ray::<task or actor>``) what it ran."""
        return ", ".join(sorted(self.titles.get(pid, {"?"})))


@dataclasses.dataclass
class FlowClock:
    """Wall times of the flow process's steps, recorded by wrapping the functions that take them."""

    marks: dict[str, float] = dataclasses.field(default_factory=dict)
    ray_session: str = ""

    def wrap(
        self,
        owner: Any,
        name: str,
        began: str,
        ended: str | None = None,
        then: Callable[[], None] | None = None,
        last: bool = False,
    ) -> None:
        """Replace ``owner.name`` by a function that records when it is called (``began``) and returns (``ended``),
        then calls ``then``. Of several calls, the first is recorded, or the last with ``last``."""
        original: Callable[..., Any] = getattr(owner, name)
        clock = self

        def mark(label: str) -> None:
            if last or label not in clock.marks:
                clock.marks[label] = time.time()

        def timed(*args: Any, **kwargs: Any) -> Any:
            mark(began)
            try:
                return original(*args, **kwargs)
            finally:
                if ended:
                    mark(ended)
                if then:
                    then()

        setattr(owner, name, timed)

    def note_ray_session(self) -> None:
        """Keep the folder of the Ray this process is connected to: its logs outlive its shutdown."""
        import ray

        self.ray_session = ray._private.worker._global_node.get_session_dir_path()


def ray_workers(session_dir: str) -> list[dict[str, Any]]:
    """Each Ray worker process of the session: pid, created, actor creation began and ended (wall times)."""
    workers = []
    for path in glob.glob(os.path.join(session_dir, "logs", "python-core-worker-*.log")):
        match = WORKER_LOG.search(path)
        if not match:
            continue
        events: dict[str, float] = {}
        with open(path, errors="replace") as log:
            for line in log:
                stamp = RAY_LOG_LINE.match(line)
                if not stamp:
                    continue
                when = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                for key, text in (
                    ("created", "Constructing CoreWorkerProcess"),
                    ("actor_began", "Creating actor"),
                    ("actor_ended", "Actor creation task finished"),
                ):
                    if text in line:
                        events.setdefault(key, when)
        workers.append({"pid": int(match.group(1)), **events})
    return sorted(workers, key=lambda w: w.get("created", 0.0))


def trace_run(training_pipeline: Any, params: Any, clock: FlowClock, sampler: ProcessSampler) -> dict[str, Any]:
    """One pipeline run: its flow marks, stage windows, workers and CPU per process, in seconds from its call."""
    clock.marks.clear()
    called = time.time()
    summary = training_pipeline(params)
    returned = time.time()
    time.sleep(2 * SAMPLE_S)  # the sampler's last rows cover the run's end

    def since(wall: float) -> float:
        return round(wall - called, 2)

    stages = {
        name: (since(s.started_at), since(s.ended_at))
        for name, s in ((f.name, getattr(summary.stage_times, f.name)) for f in dataclasses.fields(summary.stage_times))
    }
    train_began = summary.stage_times.train.started_at
    workers = [
        {
            **w,
            "titles": sampler.title(w["pid"]),
            "started_on_demand": w.get("created", 0.0) > train_began,
            **{k: since(w[k]) for k in ("created", "actor_began", "actor_ended") if k in w},
        }
        for w in ray_workers(clock.ray_session)
    ]
    return {
        "wall_s": round(returned - called, 2),
        "fit_s": round(summary.fit_seconds, 2),
        "overhead_beyond_fit_s": round(returned - called - summary.fit_seconds, 2),
        "flow": {mark: since(t) for mark, t in sorted(clock.marks.items(), key=lambda kv: kv[1])},
        "stages": stages,
        "workers": workers,
        "cpu_download": sampler.cpu_between(
            summary.stage_times.download.started_at, summary.stage_times.download.ended_at
        ),
        "cpu_evaluate": sampler.cpu_between(
            summary.stage_times.evaluate.started_at, summary.stage_times.evaluate.ended_at
        ),
    }


def table(run: dict[str, Any], index: int) -> list[str]:
    """The markdown lines of one traced run."""
    lines = [
        f"### Run {index + 1}{' (a retrain: the home has a champion)' if index else ''}: wall {run['wall_s']} s, "
        f"fit() {run['fit_s']} s, overhead beyond fit() {run['overhead_beyond_fit_s']} s",
        "",
        "| seconds from the flow's call | what |",
        "|---|---|",
    ]
    rows = [(t, f"flow process: {mark}") for mark, t in run["flow"].items()] + [(run["wall_s"], "the flow returned")]
    rows += [(begin, f"{name} step began ({end - begin:.2f} s)") for name, (begin, end) in run["stages"].items()]
    for w in run["workers"]:
        how = "started on demand" if w["started_on_demand"] else "prestarted"
        rows.append((w.get("created", float("nan")), f"Ray worker {w['pid']} created ({how}; ran {w['titles']})"))
        if "actor_began" in w:
            rows.append((w["actor_began"], f"actor creation on worker {w['pid']} began, done at {w['actor_ended']}"))
    lines += [f"| {t:.2f} | {what} |" for t, what in sorted(rows)]
    for step in ("download", "evaluate"):
        used = "; ".join(f"{p['cpu_s']} s {p['title']} ({p['pid']})" for p in run[f"cpu_{step}"])
        lines.append(f"\nCPU seconds during the {step} step, by process: {used}")
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=1024, help="training images (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--mirror", default=DATA)
    parser.add_argument("--tag", type=plain_name, default="pipeline_trace")
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()

    from flows.params import PipelineParams

    server = start_fresh_home()
    import flows.pipeline as pipeline
    import flows.task_runner as task_runner

    clock = FlowClock()
    clock.wrap(pipeline, "resolve_run", "the flow's body began")
    # The flow enters its task runner (Ray starts), then Prefect enters the steps' subflow's duplicate of it (Ray
    # joined); they exit the other way round: the first entry and the last exit are Ray's start and stop.
    clock.wrap(
        task_runner.LocalRayTaskRunner,
        "__enter__",
        "the task runner starts Ray",
        "Ray started",
        then=clock.note_ray_session,
    )
    clock.wrap(task_runner.LocalRayTaskRunner, "__exit__", "the task runner stops Ray", "Ray stopped", last=True)
    params = PipelineParams(
        mirrors=[os.path.abspath(args.mirror)], epochs=1, limit=args.limit, experiment_name="trace", model_name="trace"
    )
    runs = []
    try:
        with ProcessSampler() as sampler:
            for _ in range(args.runs):
                runs.append(trace_run(pipeline.training_pipeline, params, clock, sampler))
    finally:
        if server.pid:
            os.kill(server.pid, 15)
    machine = {"cores": os.cpu_count(), "python": platform.python_version(), "load_avg_after": os.getloadavg()}
    lines = [
        f"# Pipeline trace: {args.limit} training images, 1 epoch, {args.runs} run(s) in one home",
        "",
        f"Reproduce: `python bench/trace_pipeline.py --limit {args.limit} --runs {args.runs}`. "
        f"{machine['cores']} cores; load average after: {machine['load_avg_after']}.",
        "",
    ]
    for index, run in enumerate(runs):
        lines += table(run, index)
    write_results(args.out, args.tag, {"machine": machine, "limit": args.limit, "runs": runs}, lines)


if __name__ == "__main__":
    sys.exit(main())
