"""The group of worker actors of one attempt, on Ray Core. Runs on the driver only.

It checks the request against the cluster (an impossible one fails at once),
reserves one placement-group bundle per worker with a bounded wait, starts the
actors, lays out the ranks and starts the training function on each. Reading the
started actors' messages, or their deaths, is ``group_polling.py``'s.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from trainlib._internal import tunables
from trainlib._internal.execution import user_code
from trainlib._internal.execution.group_data import GroupData
from trainlib._internal.execution.group_polling import GroupPoller, rank_death_cause
from trainlib._internal.execution.messages import WorkerMessage
from trainlib._internal.execution.placement import RankPlan, check_resources, format_resources, plan_ranks
from trainlib._internal.execution.spec import AttemptSpec, Placement, WorkerStart
from trainlib._internal.execution.train_fn import TrainFunction
from trainlib._internal.execution.worker import TrainWorker, WorkerBackend
from trainlib.errors import ResourcesUnavailableError, WorkerError
from trainlib.scaling import ScalingConfig

logger = logging.getLogger("trainlib")


class RayWorkerGroup:
    """The actors of one attempt. ``start_actors`` -> ``placements`` -> ``start`` -> ``wait`` ... -> ``shutdown``."""

    def __init__(
        self,
        scaling: ScalingConfig,
        backend: WorkerBackend,
        train_fn: Any,
        num_workers: int | None = None,
        data: GroupData | None = None,
        bound: TrainFunction | None = None,
        runtime_env: dict[str, Any] | None = None,
    ):
        self.scaling = scaling
        self.backend = backend
        self.train_fn = train_fn  # a Ray reference to the TrainFunction, put once per run by the trainer
        self.num_workers = num_workers or scaling.max_workers  # this attempt's size (elastic runs choose it)
        self.data = data or GroupData()
        self.bound = bound  # that TrainFunction itself: which user modules to probe the nodes for
        self.runtime_env = runtime_env  # RunConfig.worker_runtime_env
        self._pg = None
        self._actors: list[Any] = []  # by rank once started
        self._placements: list[Placement] = []
        self.plan: RankPlan | None = None
        self._poller: GroupPoller | None = None  # the started attempt's messages

    def submit_actors(self) -> None:
        """Ask for the placement group and the actors, without waiting (once; ``start_actors`` waits).

        Raises ResourcesUnavailableError at once when the cluster can never fit the request.
        """
        if self._pg is not None:
            return
        check_resources(self.scaling, ray.nodes())
        bundles = [self.scaling.worker_resources for _ in range(self.num_workers)]
        selectors = self.scaling.label_selectors(self.num_workers)
        labels = {"bundle_label_selector": selectors} if selectors else {}
        # Named for people reading Ray's state; unique, as runs of one Ray job (Tune trials) share its namespace.
        name = f"trainlib-workers-{uuid.uuid4().hex[:8]}"
        self._pg = placement_group(bundles, strategy=self.scaling.placement_strategy, name=name, **labels)
        cpus, gpus = self.scaling.num_cpus_per_worker, self.scaling.num_gpus_per_worker
        custom = self.scaling.additional_resources_per_worker
        actor_cls = ray.remote(TrainWorker)
        threads = str(max(1, int(cpus)))
        # The user's runtime env variables win: Ray sets them as the process starts, before these.
        user_env = (self.runtime_env or {}).get("env_vars") or {}
        env = {k: v for k, v in {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}.items() if k not in user_env}
        options = {"runtime_env": self.runtime_env} if self.runtime_env else {}
        self._actors = [
            actor_cls.options(
                num_cpus=cpus,
                num_gpus=gpus,
                resources=custom,
                max_concurrency=4,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=i),
                **options,
            ).remote(self.backend, cpus, env)
            for i in range(self.num_workers)
        ]

    def start_actors(self) -> None:
        """Reserve the placement group (bounded wait) and start the actors; returns before they are ready."""
        # The actors are submitted before waiting: they are scheduled the moment the group is
        # reserved, not a round trip to this driver later.
        self.submit_actors()
        ready, _ = ray.wait([self._pg.ready()], timeout=self.scaling.placement_timeout_s)
        if not ready:
            available = format_resources(ray.available_resources())
            total = format_resources(ray.cluster_resources())
            self.shutdown()
            raise ResourcesUnavailableError(
                f"Timed out after {self.scaling.placement_timeout_s:.0f}s waiting for {self.num_workers} "
                f"workers x {format_resources(self.scaling.worker_resources)}: the cluster has {total} in all but only "
                f"{available} free; other tasks or actors hold the rest{self._labels_text()}. Free them, lower the "
                "request, or raise ScalingConfig.placement_timeout_s if the cluster is scaling up."
            )

    def _labels_text(self) -> str:
        if self.scaling.label_selector is None:
            return ""
        labels = [n.get("Labels") or {} for n in ray.nodes() if n.get("Alive", True)][:8]
        return (
            f", or too few nodes have the labels that ScalingConfig.label_selector={self.scaling.label_selector!r} "
            f"asks for (the nodes' labels: {labels})"
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
        # Opened on rank 0's node before any rank starts, so no rank connects to it early and backs off.
        try:
            master_port = ray.get(by_index[rank0].open_rendezvous.remote(len(by_index)))
        except RayActorError as exc:  # a failure of the attempt (restarted per FailureConfig), not of the run
            raise WorkerError(rank=0, cause=f"while the group was starting, {self._death_cause(rank0, exc)}") from None
        plan = plan_ranks(placements, master_port)
        self._actors = [by_index[i] for i in plan.order]
        self._placements = [placements[i] for i in plan.order]
        self.plan = plan
        train_fn = self._train_fn_for_nodes()
        shards = self.data.shards_for(self._actors, [p.node_id for p in self._placements])
        refs = [
            actor.start.remote(
                WorkerStart(
                    attempt=attempt,
                    info=plan.infos[rank],
                    env=plan.envs[rank],
                    train_fn=train_fn,
                    metadata=self.data.metadata,
                    dataset_shards=shards[rank],
                )
            )
            for rank, actor in enumerate(self._actors)
        ]
        # Every rank's start is awaited, but a death here is not the attempt's end: a rank may start, report and
        # die before its start reply comes back. wait() takes its death like any rank's, after recovering the
        # reports it staged and the other ranks' (raising here lost them: seen on a loaded machine).
        for ref in refs:
            try:
                ray.get(ref)
            except RayActorError:
                pass  # dead: wait() reports it
        self._poller = GroupPoller(self._actors, self._placements, attempt.storage, attempt.attempt)
        return plan

    def _train_fn_for_nodes(self) -> Any:
        """The function's reference, or, when some node cannot import the user's modules, a copy carrying them."""
        if self.bound is None or not self.bound.user_modules:
            return self.train_fn
        per_node = {p.node_id: (actor, p.node_ip) for actor, p in zip(self._actors, self._placements)}
        refs = [
            actor.missing_modules.remote(list(self.bound.user_modules), list(self.bound.driver_sys_path))
            for actor, _ in per_node.values()
        ]
        try:
            answers = ray.get(refs, timeout=tunables.WORKER_START_TIMEOUT_S)
        except RayActorError as exc:
            raise self._start_failure([], exc) from None
        missing = sorted(set().union(*answers))
        if not missing:
            return self.train_fn
        lacking = [ip for (_, ip), answer in zip(per_node.values(), answers) if answer]
        logger.info(user_code.describe(missing, lacking))
        return ray.put(self.bound.by_value(missing))

    def node_ids(self) -> list[str]:
        """The node id of each rank's actor."""
        return [p.node_id for p in self._placements]

    def notify_preemption(self, info: Any) -> None:
        """Tell every worker that ``info`` (a PreemptionInfo) is coming: ``get_preemption_info()`` returns it."""
        for actor in self._actors:
            actor.mark_preempted.remote(info)

    def wait(self, timeout: float | None = None) -> list[WorkerMessage]:
        """Block until some worker sends messages or dies (or ``timeout`` passes: then []); see ``GroupPoller``."""
        return self._poller.wait(timeout)

    def flush(self, timeout: float) -> list[WorkerMessage]:
        """After a failure: collect what the live workers still had queued, uploads included."""
        return self._poller.flush(timeout)

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

    def _death_cause(self, rank: int, exc: BaseException) -> str:
        return rank_death_cause(self._placements, rank, exc)

    def shutdown(self) -> None:
        """Kill the actors (after letting them remove their staging folders) and release the placement group."""
        if self._actors:
            ray.wait([a.close.remote() for a in self._actors], num_returns=len(self._actors), timeout=2.0)
        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self._actors = []
        self._poller = None
        if self._pg is not None:
            try:
                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001 - cluster already gone
                pass
            self._pg = None
