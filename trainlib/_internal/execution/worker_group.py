"""The group of worker actors of one attempt, on Ray Core. Runs on the driver only.

It checks the request against the cluster (an impossible one fails at once),
reserves one placement-group bundle per worker with a bounded wait, starts the
actors, lays out the ranks, and turns every actor's messages, or its death,
into typed messages for the controller (``messages.py``).
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from trainlib._internal import tunables
from trainlib._internal.execution.messages import FailedMessage, WorkerMessage, is_last
from trainlib._internal.execution.placement import RankPlan, check_resources, format_resources, plan_ranks
from trainlib._internal.execution.spec import AttemptSpec, Placement, WorkerStart
from trainlib._internal.execution.worker import TrainWorker, WorkerBackend
from trainlib.config import ScalingConfig
from trainlib.errors import ResourcesUnavailableError, WorkerError

logger = logging.getLogger("trainlib")


class RayWorkerGroup:
    """The actors of one attempt. ``start_actors`` -> ``placements`` -> ``start`` -> ``wait`` ... -> ``shutdown``."""

    def __init__(self, scaling: ScalingConfig, backend: WorkerBackend, train_fn: Any):
        self.scaling = scaling
        self.backend = backend
        self.train_fn = train_fn  # a Ray reference to the TrainFunction, put once per run by the trainer
        self._pg = None
        self._actors: list[Any] = []  # by rank once started
        self._pending: dict[Any, int] = {}  # outstanding next_messages ref -> rank
        self._placements: list[Placement] = []
        self.plan: RankPlan | None = None

    def start_actors(self) -> None:
        """Reserve the placement group (bounded wait) and start the actors; returns before they are ready."""
        check_resources(self.scaling, ray.nodes())
        bundles = [self.scaling.worker_resources for _ in range(self.scaling.num_workers)]
        self._pg = placement_group(bundles, strategy=self.scaling.placement_strategy, name="trainlib-workers")
        cpus = self.scaling.worker_resources.get("CPU", 0)
        gpus = self.scaling.worker_resources.get("GPU", 0)
        custom = {k: v for k, v in self.scaling.worker_resources.items() if k not in ("CPU", "GPU")}
        actor_cls = ray.remote(TrainWorker)
        threads = str(max(1, int(cpus)))
        self._actors = [
            actor_cls.options(
                num_cpus=cpus, num_gpus=gpus, resources=custom, max_concurrency=4,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=i),
            ).remote(self.backend, cpus, {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
            for i in range(self.scaling.num_workers)
        ]
        # The actors are submitted before waiting: they are scheduled the moment the group is
        # reserved, not a round trip to this driver later.
        ready, _ = ray.wait([self._pg.ready()], timeout=self.scaling.placement_timeout_s)
        if not ready:
            available = format_resources(ray.available_resources())
            total = format_resources(ray.cluster_resources())
            self.shutdown()
            raise ResourcesUnavailableError(
                f"Timed out after {self.scaling.placement_timeout_s:.0f}s waiting for {self.scaling.num_workers} "
                f"workers x {format_resources(self.scaling.worker_resources)}: the cluster has {total} in all but only "
                f"{available} free; other tasks or actors hold the rest. Free them, lower the request, or raise "
                "ScalingConfig.placement_timeout_s if the cluster is scaling up."
            )

    def placements(self) -> list[Placement]:
        """Where each actor landed (waits for the actors to finish starting)."""
        refs = [a.describe.remote() for a in self._actors]
        try:
            self._placements = ray.get(refs, timeout=tunables.WORKER_START_TIMEOUT_S)
        except RayActorError as exc:
            raise self._start_failure(refs, exc) from None
        except GetTimeoutError:
            raise ResourcesUnavailableError(
                f"Worker actors did not start within {tunables.WORKER_START_TIMEOUT_S:.0f}s."
            ) from None
        return self._placements

    def start(self, attempt: AttemptSpec) -> RankPlan:
        """Lay out ranks and start the training function on every worker."""
        placements = self._placements or self.placements()
        by_index = list(self._actors)
        rank0 = plan_ranks(placements, 0).order[0]
        master_port = ray.get(by_index[rank0].find_free_port.remote())  # free on rank 0's node
        plan = plan_ranks(placements, master_port)
        self._actors = [by_index[i] for i in plan.order]
        self._placements = [placements[i] for i in plan.order]
        self.plan = plan
        refs = [
            actor.start.remote(WorkerStart(attempt=attempt, info=plan.infos[rank], env=plan.envs[rank],
                                           train_fn=self.train_fn))
            for rank, actor in enumerate(self._actors)
        ]
        try:
            ray.get(refs)
        except RayActorError as exc:
            raise self._start_failure(refs, exc) from None
        self._pending = {actor.next_messages.remote(): rank for rank, actor in enumerate(self._actors)}
        return plan

    def wait(self) -> list[WorkerMessage]:
        """Block until some worker sends messages or dies; return them in order (a death as a failure)."""
        ready, _ = ray.wait(list(self._pending), num_returns=1)
        out: list[WorkerMessage] = []
        for ref in ready:
            rank = self._pending.pop(ref)
            try:
                messages = ray.get(ref)
            except RayActorError as exc:
                messages = [self._death_message(rank, exc)]
            out.extend(messages)
            if not any(is_last(m) for m in messages):
                self._pending[self._actors[rank].next_messages.remote()] = rank
        return out

    def _start_failure(self, refs: list, exc: BaseException) -> WorkerError:
        """A WorkerError for the first actor that died while the group was starting."""
        rank = 0
        for index, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=0)
            except RayActorError:
                rank = index
                break
            except Exception:  # noqa: BLE001 - not finished or another error: not the dead one
                continue
        return WorkerError(rank=rank, cause=f"while the group was starting, {self._death_cause(rank, exc)}")

    def _death_message(self, rank: int, exc: BaseException) -> FailedMessage:
        return FailedMessage(rank=rank, cause=self._death_cause(rank, exc))

    def _death_cause(self, rank: int, exc: BaseException) -> str:
        p = self._placements[rank] if rank < len(self._placements) else None
        text = str(exc).strip().splitlines()
        detail = next((line.strip() for line in text if "exit" in line.lower() or "killed" in line.lower()
                       or "OOM" in line), text[0] if text else "")
        return (f"the worker process (pid {p.pid if p else None}) on node {p.node_ip if p else None} died: {detail}. It may have "
                "been killed (OOM, SIGKILL) or its node lost")

    def flush(self, timeout: float) -> list[WorkerMessage]:
        """After a failure: collect what the live workers still had queued, uploads included."""
        out: list[WorkerMessage] = []
        refs = {a.flush.remote(timeout): rank for rank, a in enumerate(self._actors)}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout + 1.0)
        # Outstanding next_messages calls of ranks stuck in a collective never return: take
        # only those already answered (a dead rank's answers at once, with its death).
        if self._pending:
            ready += ray.wait(list(self._pending), num_returns=len(self._pending), timeout=0)[0]
        for ref in ready:
            rank = refs.get(ref, self._pending.get(ref))
            try:
                out.extend(ray.get(ref))
            except RayActorError as exc:
                # A rank that died: the controller may pick its death as the root cause.
                out.append(self._death_message(rank, exc))
        return out

    def shutdown(self) -> None:
        """Kill the actors and release the placement group."""
        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self._actors = []
        self._pending = {}
        if self._pg is not None:
            try:
                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001 - cluster already gone
                pass
            self._pg = None
