"""Timeouts, retry counts and sizes: every tunable of trainlib, in one place. Driver and workers.

Read by the driver and the workers. Change them here, not in the code that uses them.
"""

# Storage: transient I/O errors are retried with exponential backoff.
STORAGE_RETRY_ATTEMPTS = 5
STORAGE_RETRY_BASE_DELAY_S = 0.2
STORAGE_RETRY_MAX_DELAY_S = 5.0

# A worker may have this many checkpoint uploads in flight before report() blocks;
# it bounds the local disk used for staging when storage is slower than training.
MAX_PENDING_UPLOADS_PER_WORKER = 2

# torch.distributed: process-group start-up and every collective time out after this,
# so a hung collective becomes a worker failure instead of a hang.
DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0

# Times all ranks form a gloo process group before giving up: gloo's full-mesh connect fails now and
# then with all ranks alive ("Connection closed by peer", also in PyTorch's own CI), and a new try works.
GLOO_CONNECT_ATTEMPTS = 3
GLOO_VERDICT_READ_TIMEOUT_S = 10.0  # after the last failed try, how long rank 0 keeps the store up for the others

# How long the driver waits for worker actors to start (import torch, join the group).
WORKER_START_TIMEOUT_S = 300.0

# How long the workers' last log lines get at exit (Ray's own exit hook sleeps 0.5 s for them): the driver's
# log reader reads for at most this long before Ray shuts down (workers that keep printing must not hold the
# exit); with Ray's log monitor instead, the embedded Ray is shut down this long after the last fit() returned.
WORKER_LOG_FLUSH_S = 0.5

# After one rank fails, how long the others get to finish their pending checkpoint uploads, so
# reports that every rank made are still committed before the group is torn down.
FLUSH_AFTER_FAILURE_S = 30.0

# MLflow tracking (trainlib.mlflow): every call of the logger's own client is bounded, so a
# tracking outage costs the driver seconds, never the run. Failed calls are spooled locally.
MLFLOW_HTTP_MAX_RETRIES = 2
MLFLOW_HTTP_BACKOFF_FACTOR = 1
MLFLOW_HTTP_TIMEOUT_S = 10
# While the server is unreachable, try it again at most this often (one bounded probe).
MLFLOW_RECONNECT_INTERVAL_S = 5.0

# The run lease (one driver per run): the owner rewrites its lease this often; a lease whose
# heartbeat is older than its TTL is stale and the next driver takes the run over. Clocks of
# the drivers' hosts must agree to well within the TTL.
LEASE_HEARTBEAT_S = 10.0
LEASE_TTL_S = 60.0

# Connecting to a Ray cluster by address: a TCP probe first, so an address where nothing
# listens fails in seconds rather than after minutes of GCS retries.
RAY_CONNECT_TIMEOUT_S = 5.0

# After a rank's training function finished, how long the others may still run before the
# driver warns (half of it) and fails the attempt naming them. FailureConfig.straggler_timeout_s
# overrides it per run.
DEFAULT_STRAGGLER_TIMEOUT_S = 1800.0

# Driver-side callbacks (MLflow, Prefect progress) run on a background thread, off the commit
# path; at the end of a run the driver waits this long for the queued calls, then goes on.
CALLBACK_DRAIN_TIMEOUT_S = 120.0

# MLflow start-up probe: one request, answered within this time, before Ray starts.
MLFLOW_PROBE_TIMEOUT_S = 3.0

# The longest metric name report() accepts (MLflow's limit for metric keys).
MAX_METRIC_NAME_LENGTH = 250

# get_all_reported_checkpoints() polls the run's metrics log this often while it waits for commits.
COMMIT_POLL_INTERVAL_S = 0.1

# How often the driver asks Ray which nodes it is draining (a preemption of the run's nodes).
PREEMPTION_POLL_INTERVAL_S = 1.0

# Elastic runs: after a group stops, its resources return to Ray a moment later; the next group's size
# is the most workers seen to fit within this long.
ELASTIC_SETTLE_S = 2.0

# glibc malloc in torch training workers (trainlib/_internal/startup/allocator.py). With glibc's defaults, a
# training step's tensors (MBs each, allocated and freed every step) are mmap'd and unmapped, or the heap
# is trimmed and grown again, and each page given back is faulted in again on the next step. Served from the heap
# and kept (up to this much free at its top), the faults stop (docs/benchmarks.md, "Steady state (kept)").
WORKER_MALLOC_MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's own ceiling for its adaptive threshold
WORKER_MALLOC_TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024

# trainlib.collective (barrier, broadcast_from_rank_zero): Ray Train's environment variables and defaults. No
# timeout unless set (a rank that never arrives still ends: its group fails or straggler_timeout_s fires), and a
# warning naming the missing ranks on rank 0 at this interval while it waits.
COLLECTIVE_TIMEOUT_S_ENV_VAR = "RAY_TRAIN_COLLECTIVE_TIMEOUT_S"
COLLECTIVE_WARN_INTERVAL_S_ENV_VAR = "RAY_TRAIN_COLLECTIVE_WARN_INTERVAL_S"
DEFAULT_COLLECTIVE_WARN_INTERVAL_S = 60.0
# broadcast_from_rank_zero warns above this many pickled bytes (it is meant for small data, as in Ray Train).
MAX_BROADCAST_SIZE_BYTES = 1000
