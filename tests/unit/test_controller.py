"""The controller's state machine, driven by a fake worker group: no Ray, no processes.

Each fake attempt is a script of message batches; the controller reads it
through the same WorkerGroup protocol the Ray group implements.
"""

from __future__ import annotations

import os
import time

import fsspec
import pytest
from conftest import controller_on

from trainlib._internal import tunables
from trainlib._internal.execution.controller import Controller
from trainlib._internal.execution.messages import DoneMessage, FailedMessage, ReportMessage
from trainlib._internal.execution.restart_policy import FailurePolicy
from trainlib._internal.execution.spec import Placement
from trainlib._internal.storage.run_record import RunStatus
from trainlib._internal.storage.run_storage import RunStorage
from trainlib.callbacks import Callback
from trainlib.config import CheckpointConfig, FailureConfig
from trainlib.errors import StorageError, TrainingFailedError


def report(rank, step, metrics=None, manifest=None):
    return ReportMessage(
        rank=rank, step=step, metrics=metrics or {"step": step}, manifest=manifest, reported_at=time.time()
    )


def done(rank):
    return DoneMessage(rank)


def error(rank, cause="ValueError: boom", tb="Traceback (most recent call last):\n  ...\nValueError: boom\n"):
    return FailedMessage(rank=rank, cause=cause, traceback_text=tb)


class FakeGroup:
    """Plays back one attempt's scripted messages, one batch per ``wait()``."""

    def __init__(self, script, world_size, nodes=None, storage=None, files=None, flushed=None):
        self.script = list(script)
        self.flushed = list(flushed or [])  # what flush() returns after the first failure
        self.world_size = world_size
        self.nodes = nodes or ["node-a"] * world_size
        self.storage = storage
        self.files = files or {}  # step -> {relpath: bytes}, written before the report arrives
        self.started_with = None
        self.shut_down = False
        self.plan = None
        self.flush_timeouts = []

    def start_actors(self):
        pass

    def placements(self):
        return [Placement(node_id=n, node_ip=f"10.0.0.{i}", hostname=n, pid=100 + i) for i, n in enumerate(self.nodes)]

    def start(self, attempt):
        self.started_with = {
            "checkpoint": attempt.checkpoint,
            "first_step": attempt.first_step,
            "attempt": attempt.attempt,
        }
        return None

    def wait(self, timeout=None):
        if not self.script:
            raise AssertionError("the controller waited for more messages than the script holds")
        batch = self.script.pop(0)
        batch = batch if isinstance(batch, list) else [batch]
        self._write_files(batch)
        return batch

    def _write_files(self, batch):
        for message in batch:
            if isinstance(message, ReportMessage) and message.manifest is not None:
                step = message.step
                for rel, data in self.files.get((step, message.rank), {}).items():
                    path = os.path.join(self.storage.checkpoint_path(step), rel)
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    with open(path, "wb") as f:
                        f.write(data)

    def flush(self, timeout):
        self.flush_timeouts.append(timeout)
        self._write_files(self.flushed)
        return self.flushed

    def shutdown(self):
        self.shut_down = True


class Recorder(Callback):
    def __init__(self):
        self.events = []

    def after_report(self, run, report):
        self.events.append(("report", report.step, report.checkpoint is not None, report.attempt))

    def after_failure(self, run, failure, will_restart):
        self.events.append(("failure", failure.rank, will_restart))

    def after_checkpoint_deleted(self, run, checkpoint):
        self.events.append(("deleted", os.path.basename(checkpoint.path)))


@pytest.fixture
def storage(tmp_path):
    return RunStorage(fsspec.filesystem("file"), str(tmp_path / "runs"), "run")


def make_controller(storage, attempts, *, max_failures=0, checkpoint_config=None, callbacks=None, failure_config=None):
    groups = list(attempts)
    made = []

    def make_group():
        group = groups.pop(0)
        made.append(group)
        return group

    controller = controller_on(
        storage,
        make_group,
        checkpoint_config=checkpoint_config,
        failure_config=failure_config or FailureConfig(max_failures),
        callbacks=callbacks,
    )
    return controller, made


def ckpt_files(step):
    return {(step, 0): {"model.pt": b"w" * (10 + step)}, (step, 1): {"rank1/shard.pt": b"s" * 7}}


def manifests(step):
    return {0: {"model.pt": 10 + step}, 1: {"rank1/shard.pt": 7}}


def reports_with_ckpt(step):
    m = manifests(step)
    return [report(0, step, {"loss": 1.0 / step}, m[0]), report(1, step, {"loss": 9.0}, m[1])]


def test_failure_policy_counts():
    assert not FailurePolicy(0).should_restart(1)
    assert FailurePolicy(1).should_restart(1) and not FailurePolicy(1).should_restart(2)
    assert all(FailurePolicy(-1).should_restart(n) for n in (1, 10, 10_000))


def test_reports_from_all_ranks_commit_one_checkpoint(storage):
    files = {**ckpt_files(1), **ckpt_files(2)}
    group = FakeGroup([*reports_with_ckpt(1), reports_with_ckpt(2), done(0), done(1)], 2, storage=storage, files=files)
    recorder = Recorder()
    controller, _ = make_controller(storage, [group], callbacks=[recorder])
    controller.run()
    assert controller.state is RunStatus.FINISHED and group.shut_down
    committed = storage.committed_checkpoints()
    assert [c.step for c in committed] == [1, 2]
    # Rank 0's metrics are the run's; the manifest merges every rank's files.
    assert committed[-1].metrics == {"loss": 0.5}
    marker = storage.read_json(os.path.join(committed[-1].path, ".trainlib_commit.json"))
    assert marker["files"] == {"model.pt": 12, "rank1/shard.pt": 7}
    rows = storage.read_metrics_log()
    assert [(r["step"], r["checkpoint"]) for r in rows] == [(1, "checkpoint_000001"), (2, "checkpoint_000002")]
    controller.callback_runner.drain(10)  # hooks run in the background
    assert recorder.events == [("report", 1, True, 0), ("report", 2, True, 0)]


def test_report_missing_from_one_rank_is_not_committed(storage):
    # Rank 0 reports step 2 with its checkpoint files, rank 1 fails before reporting step 2.
    files = {**ckpt_files(1), **ckpt_files(2)}
    m = manifests(2)
    group = FakeGroup(
        [reports_with_ckpt(1), report(0, 2, {"loss": 0.5}, m[0]), error(1)], 2, storage=storage, files=files
    )
    recorder = Recorder()
    controller, _ = make_controller(storage, [group], callbacks=[recorder])
    with pytest.raises(TrainingFailedError):
        controller.run()
    assert controller.state is RunStatus.FAILED
    assert [c.step for c in storage.committed_checkpoints()] == [1]
    assert [r["step"] for r in storage.read_metrics_log()] == [1]
    controller.callback_runner.drain(10)  # hooks run in the background
    assert ("report", 2, True, 0) not in recorder.events
    # The half-reported folder exists on disk but is not a checkpoint; the next attempt clears it.
    assert os.path.isdir(storage.checkpoint_path(2))
    assert storage.remove_uncommitted() == [storage.checkpoint_path(2)]


def test_mismatched_report_counts_fail_with_a_clear_error(storage):
    group = FakeGroup([report(0, 1), report(1, 1), report(0, 2), done(0), done(1)], 2, storage=storage)
    controller, _ = make_controller(storage, [group])
    with pytest.raises(TrainingFailedError) as info:
        controller.run()
    failure = info.value.failures[0]
    assert failure.rank == 1
    assert "report() different numbers of times" in failure.cause
    assert "{0: 2, 1: 1}" in failure.cause and "same number of times" in failure.cause
    assert [r["step"] for r in storage.read_metrics_log()] == [1]


def test_max_failures_zero_fails_with_rank_cause_and_traceback(storage):
    group = FakeGroup(
        [
            reports_with_ckpt(1),
            error(1, "RuntimeError: data loader broke", "Traceback ...\nRuntimeError: data loader broke\n"),
        ],
        2,
        storage=storage,
        files=ckpt_files(1),
    )
    recorder = Recorder()
    controller, made = make_controller(storage, [group], max_failures=0, callbacks=[recorder])
    with pytest.raises(TrainingFailedError) as info:
        controller.run()
    assert len(made) == 1 and group.shut_down
    err = info.value
    assert [f.rank for f in err.failures] == [1]
    text = str(err)
    assert "worker rank 1" in text and "RuntimeError: data loader broke" in text and "Traceback ..." in text
    controller.callback_runner.drain(10)  # hooks run in the background
    assert recorder.events[-1] == ("failure", 1, False)


def test_restart_resumes_from_latest_checkpoint_up_to_max_failures(storage):
    files = {**ckpt_files(1), **ckpt_files(2), **ckpt_files(3)}
    first = FakeGroup(
        [reports_with_ckpt(1), reports_with_ckpt(2), error(0, "OSError: disk")], 2, storage=storage, files=files
    )
    second = FakeGroup([reports_with_ckpt(3), [done(0), done(1)]], 2, storage=storage, files=files)
    recorder = Recorder()
    controller, made = make_controller(storage, [first, second], max_failures=1, callbacks=[recorder])
    controller.run()
    assert controller.state is RunStatus.FINISHED
    assert first.started_with == {"checkpoint": None, "first_step": 1, "attempt": 0}
    assert second.started_with["first_step"] == 3 and second.started_with["attempt"] == 1
    assert second.started_with["checkpoint"].path == storage.checkpoint_path(2)
    controller.callback_runner.drain(10)  # hooks run in the background
    assert ("failure", 0, True) in recorder.events
    rows = storage.read_metrics_log()
    assert [(r["step"], r["attempt"]) for r in rows] == [(1, 0), (2, 0), (3, 1)]


def test_failures_beyond_max_failures_carry_the_history(storage):
    attempts = [FakeGroup([error(i % 2, f"ValueError: failure {i}")], 2, storage=storage) for i in range(3)]
    controller, made = make_controller(storage, attempts, max_failures=2)
    with pytest.raises(TrainingFailedError) as info:
        controller.run()
    assert len(made) == 3
    causes = [f.cause for f in info.value.failures]
    assert causes == ["ValueError: failure 0", "ValueError: failure 1", "ValueError: failure 2"]
    text = str(info.value)
    assert "max_failures=2" in text and "attempt 1: rank 0" in text and "attempt 3: rank 0" in text


def test_unlimited_restarts(storage):
    attempts = [FakeGroup([error(0)], 2, storage=storage) for _ in range(7)]
    attempts.append(FakeGroup([[done(0), done(1)]], 2, storage=storage))
    controller, made = make_controller(storage, attempts, max_failures=-1)
    controller.run()
    assert controller.state is RunStatus.FINISHED and len(made) == 8 and len(controller.restarts.failures) == 7


def test_local_storage_on_several_nodes_fails_before_training(storage):
    group = FakeGroup([], 2, nodes=["node-a", "node-b"], storage=storage)
    controller, _ = make_controller(storage, [group])
    with pytest.raises(StorageError, match="shared storage") as info:
        controller.run()
    assert "RunConfig.storage_path" in str(info.value)
    assert group.started_with is None and group.shut_down


def test_retention_runs_on_commit_and_notifies(storage):
    files = {**ckpt_files(1), **ckpt_files(2), **ckpt_files(3)}
    group = FakeGroup(
        [reports_with_ckpt(1), reports_with_ckpt(2), reports_with_ckpt(3), [done(0), done(1)]],
        2,
        storage=storage,
        files=files,
    )
    recorder = Recorder()
    controller, _ = make_controller(
        storage, [group], callbacks=[recorder], checkpoint_config=CheckpointConfig(num_to_keep=1)
    )
    controller.run()
    assert [c.step for c in storage.committed_checkpoints()] == [3]
    assert not os.path.exists(storage.checkpoint_path(1))
    controller.callback_runner.drain(10)  # hooks run in the background
    assert ("deleted", "checkpoint_000001") in recorder.events
    assert ("deleted", "checkpoint_000002") in recorder.events


def test_a_resumed_run_continues_the_attempt_numbering(storage):
    """Rows of an earlier driver run (attempts 0-1) and of the resumed one never share an attempt."""
    rows = [
        {"step": 1, "attempt": 0, "time": 0, "checkpoint": None, "metrics": {}},
        {"step": 1, "attempt": 1, "time": 0, "checkpoint": None, "metrics": {}},
    ]
    group = FakeGroup([[report(0, 2), report(1, 2)], [done(0), done(1)]], 2, storage=storage)
    controller, _ = make_controller(storage, [group])
    controller.commits.metrics_rows = list(rows)
    controller.commits.attempt = Controller(
        storage=storage,
        make_worker_group=None,
        checkpoint_config=CheckpointConfig(),
        failure_config=FailureConfig(),
        callbacks=[],
        run_info=controller.run_info,
        metrics_rows=rows,
        verbose=False,
    ).commits.attempt
    controller.run()
    assert group.started_with["attempt"] == 2
    assert controller.commits.metrics_rows[-1]["attempt"] == 2


def test_a_peer_death_is_the_root_cause_not_the_collective_that_lost_it(storage):
    """Rank 0's all_reduce fails first because rank 1 died: the failure names rank 1."""
    echo = error(0, "RuntimeError: [pair.cc:545] Read error [127.0.0.1]:5526: Connection reset by peer")
    death = error(1, "the worker process (pid 4242) on node 10.0.0.1 died: SIGKILL", "")
    group = FakeGroup([echo], 2, storage=storage, flushed=[death])
    controller, _ = make_controller(storage, [group])
    with pytest.raises(TrainingFailedError) as info:
        controller.run()
    assert info.value.failures[0].rank == 1 and "died" in info.value.failures[0].cause


def test_reports_flushed_after_a_failure_still_commit(storage):
    """Rank 1 reported step 1 but its message was still queued when rank 0 failed."""
    m = manifests(1)
    group = FakeGroup(
        [report(0, 1, {"loss": 1.0}, m[0]), error(0)],
        2,
        storage=storage,
        files=ckpt_files(1),
        flushed=[report(1, 1, {"loss": 9.0}, m[1])],
    )
    controller, _ = make_controller(storage, [group])
    with pytest.raises(TrainingFailedError) as info:
        controller.run()
    assert info.value.failures[0].rank == 0
    assert [c.step for c in storage.committed_checkpoints()] == [1]


def test_local_storage_declared_shared_runs_on_several_nodes(tmp_path):
    from trainlib._internal.util.filesystem import declares_shared

    assert declares_shared("file:///mnt/nfs/runs") and not declares_shared("/mnt/nfs/runs")
    assert not declares_shared(None)
    shared = RunStorage(fsspec.filesystem("file"), str(tmp_path / "runs"), "run", shared=True)
    group = FakeGroup([[report(0, 1), report(1, 1)], [done(0), done(1)]], 2, nodes=["node-a", "node-b"], storage=shared)
    controller, _ = make_controller(shared, [group])
    controller.run()
    assert controller.state is RunStatus.FINISHED and controller.num_nodes == 2


def test_worker_error_text_shows_only_what_is_known():
    from trainlib.errors import WorkerError

    assert str(WorkerError(1, "ValueError: x", node_ip="10.0.0.2")).startswith("worker rank 1 (node 10.0.0.2) failed")
    assert "(node 10.0.0.2, pid 7)" in str(WorkerError(1, "ValueError: x", node_ip="10.0.0.2", pid=7))
    assert str(WorkerError(0, "boom")) == "worker rank 0 failed: boom"


def test_a_workers_flush_wakes_the_drivers_next_messages_call():
    """The driver waits for each rank's outstanding next_messages() after a failure: flush() must end a call that
    is blocked on the emptied outbox, or the driver would wait out its timeout (or drop what the call held)."""
    import threading

    from trainlib._internal.execution.messages import DoneMessage
    from trainlib._internal.execution.worker import TrainWorker, WorkerBackend

    worker = TrainWorker(WorkerBackend(), 1, {})
    answers = []
    call = threading.Thread(target=lambda: answers.append(worker.next_messages()), daemon=True)
    call.start()
    call.join(0.2)
    assert call.is_alive()  # blocked: nothing queued
    assert worker.flush(0) == []
    call.join(5)
    assert not call.is_alive() and answers == [[]]
    worker.outbox.put(DoneMessage(0))  # the wake-up is never handed to the driver
    assert worker.next_messages() == [DoneMessage(0)]


def _preempted_attempt(storage):
    """Step 1 reported by both ranks; rank 0 (node-a) reports a just-in-time checkpoint at step 2, then the
    drained node's rank 1 (node-b) is lost before reporting it. Then an attempt that finishes."""
    m = manifests(2)
    files = {**ckpt_files(1), (2, 0): {"model.pt": b"w" * 12}}
    lost = error(1, "the worker process (pid 4242) on node 10.0.0.1 died: SIGKILL", "")
    first = FakeGroup(
        [reports_with_ckpt(1), report(0, 2, {"loss": 0.5}, m[0]), lost],
        2,
        nodes=["node-a", "node-b"],
        storage=storage,
        files=files,
    )
    return first, FakeGroup([[done(0), done(1)]], 2, nodes=["node-a", "node-c"], storage=storage)


@pytest.mark.parametrize(
    "relax, drained, committed",
    [(True, "node-b", [1, 2]), (False, "node-b", [1]), (True, "node-a", [1])],  # rank 0 on node-a: never relaxed
)
def test_relax_collectives_on_preemption_commits_what_the_survivors_reported(tmp_path, relax, drained, committed):
    from trainlib._internal.execution.monitor import PreemptionWatcher

    storage = RunStorage(fsspec.filesystem("file"), str(tmp_path / "runs"), "run", shared=True)  # two nodes

    first, second = _preempted_attempt(storage)
    # max_failures=1: with node-a drained, the loss of rank 1 (node-b) is an ordinary failure.
    config = FailureConfig(max_failures=1, relax_collectives_on_preemption=relax, preemption_grace_s=12.5)
    controller, _ = make_controller(storage, [first, second], failure_config=config)
    controller.watcher = PreemptionWatcher(get_draining=dict)
    controller.watcher.drained = {drained}
    controller.run()
    assert [c.step for c in storage.committed_checkpoints()] == committed
    assert second.started_with["checkpoint"].path.endswith(f"checkpoint_{committed[-1]:06d}")
    # preemption_grace_s: the survivors' uploads get that much longer than after any other failure.
    assert first.flush_timeouts == [tunables.FLUSH_AFTER_FAILURE_S + 12.5]


def test_preemption_grace_is_not_added_to_other_failures(storage):
    group = FakeGroup([reports_with_ckpt(1), error(0)], 2, storage=storage, files=ckpt_files(1))
    controller, _ = make_controller(storage, [group], failure_config=FailureConfig(preemption_grace_s=60))
    with pytest.raises(TrainingFailedError):
        controller.run()
    assert group.flush_timeouts == [tunables.FLUSH_AFTER_FAILURE_S]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"relax_collectives_on_preemption": "yes"}, "relax_collectives_on_preemption must be True or False"),
        ({"preemption_grace_s": -1}, "preemption_grace_s=-1 is invalid"),
        ({"preemption_grace_s": "10"}, "preemption_grace_s must be a number"),
    ],
)
def test_preemption_settings_are_checked(kwargs, match):
    with pytest.raises((TypeError, ValueError), match=match):
        FailureConfig(**kwargs)


def test_run_names_take_rays_tune_pattern_but_no_path():
    from trainlib.config import RunConfig

    assert RunConfig(name="train-trial_id=54b65_00003").name == "train-trial_id=54b65_00003"
    with pytest.raises(ValueError, match="RunConfig.name='a/b' is invalid"):
        RunConfig(name="a/b")
